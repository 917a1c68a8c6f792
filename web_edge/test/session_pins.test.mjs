// EdgeSession.open against a real HTTP server (node:http on loopback) that serves a model and
// its bundle tarball, then swaps the bundle: the session pins the first bundle, refuses the
// swap before fetching it, opens with acceptBundle, and refuses any bundle outside
// trustedBundles. The bundles are designed tables made here (a PCA-like float32 table).
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import { createTar } from "nanotar";

import { BundleChanged } from "../dist/service/pins.js";
import { EdgeSession } from "../dist/session/session.js";
import { MemoryPinStore } from "../dist/service/pins.js";
import { bundleFiles, gaussianTable, vocabulary } from "./bundles.mjs";

const VOCAB = vocabulary(300, ["the", "movie", "was", "good"]);

function tarOf(files) {
  return createTar(Object.entries(files).filter(([n]) => n !== "id").map(([name, data]) => ({ name, data })));
}

async function serve() {
  const state = { bundle: null, requests: [] };
  const server = createServer((req, res) => {
    state.requests.push(req.url);
    if (req.url === "/v1/models") {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ models: [{ id: "m1", mechanism: "dchi-text", params: { eta: 2.0 },
        bundle_id: state.bundle.id, max_length: 64, labels: ["negative", "positive"] }] }));
    } else if (req.url === `/v1/bundles/${state.bundle.id}`) {
      res.writeHead(200, { "Content-Type": "application/x-tar" });
      res.end(Buffer.from(state.bundle.tar));
    } else {
      res.writeHead(404, { "Content-Type": "application/problem+json" });
      res.end(JSON.stringify({ type: "about:blank", title: "Not Found" }));
    }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { state, url: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => server.close(r)) };
}

test("EdgeSession pins the model's bundle, refuses a swap, accepts it on request, honours trustedBundles", async () => {
  const first = bundleFiles({ vocab: VOCAB, kind: "float32", values: gaussianTable(300, 8, 1), dim: 384 });
  const second = bundleFiles({ vocab: VOCAB, kind: "float32", values: gaussianTable(300, 8, 2), dim: 384 });
  const srv = await serve();
  const pins = new MemoryPinStore();
  try {
    srv.state.bundle = { id: first.id, tar: tarOf(first) };
    const s = await EdgeSession.open({ server: srv.url, pins });
    assert.equal(s.info.bundleId, first.id);
    assert.equal(s.info.dim, 8); // the privatization table's dimension, not the model's 384
    assert.equal(s.guarantee.worst_case.dim, 8); // the guarantee is the table's
    assert.equal(s.guarantee.worst_case.epsilon, 2.0 * s.info.diameter); // eta x D of this table
    await s.close();
    assert.equal(await pins.get(`${srv.url}|m1`), first.id);

    srv.state.bundle = { id: second.id, tar: tarOf(second) };
    const before = srv.state.requests.length;
    await assert.rejects(EdgeSession.open({ server: srv.url, pins }), (e) => e instanceof BundleChanged
      && e.message.includes(first.id.slice(0, 12)) && e.message.includes(second.id.slice(0, 12)));
    assert.deepEqual(srv.state.requests.slice(before), ["/v1/models"]); // nothing of the new bundle fetched
    await assert.rejects(EdgeSession.open({ server: srv.url, pins, acceptBundle: [first.id], trustedBundles: first.id }),
      (e) => e instanceof BundleChanged && /not one of the 1 bundle id\(s\) this app trusts/.test(e.message));
    const s2 = await EdgeSession.open({ server: srv.url, pins, acceptBundle: second.id });
    assert.equal(s2.info.bundleId, second.id);
    await s2.close();
    assert.equal(await pins.get(`${srv.url}|m1`), second.id);
    await assert.rejects(EdgeSession.open({ server: srv.url, pins, acceptBundle: "nope" }),
      { message: "acceptBundle: 'nope' is not a bundle id (64 hex digits)" });
  } finally {
    await srv.close();
  }
});
