// EdgeSession.open against a real HTTP server (node:http on loopback) that serves a model and
// its bundle tarball, then swaps the bundle: the session pins the first bundle, refuses the
// swap before fetching it, opens with acceptBundle, refuses an unverified bundle with
// refuseUnverified, and says how far it vouches for the bundle (issue 42). The bundles are
// designed tables made here over an English vocabulary (a PCA-like float32 table), unverified:
// they pass the text floor at the model's eta.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import { createTar } from "nanotar";

import { BundleChanged } from "../dist/service/pins.js";
import { EdgeSession } from "../dist/session/session.js";
import { MemoryPinStore } from "../dist/service/pins.js";
import { bundleFiles, englishVocabulary, gaussianTable } from "./bundles.mjs";

const VOCAB = englishVocabulary(1300);

function tarOf(files) {
  const tar = createTar(Object.entries(files).filter(([n]) => n !== "id").map(([name, data]) => ({ name, data })));
  return Buffer.concat([tar, new Uint8Array(1024)]); // the two zero blocks that end an archive
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

test("EdgeSession pins the model's bundle, refuses a swap, accepts it on request, refuses unverified ones on request", async () => {
  const first = bundleFiles({ vocab: VOCAB, kind: "float32", values: gaussianTable(VOCAB.length, 8, 1), dim: 384 });
  const second = bundleFiles({ vocab: VOCAB, kind: "float32", values: gaussianTable(VOCAB.length, 8, 2), dim: 384 });
  const srv = await serve();
  const pins = new MemoryPinStore();
  try {
    srv.state.bundle = { id: first.id, tar: tarOf(first) };
    const s = await EdgeSession.open({ server: srv.url, pins, textFloorCache: false });
    assert.equal(s.info.bundleId, first.id);
    assert.equal(s.trust.kind, "unverified");
    assert.equal(s.trustNote, `bundle ${first.id.slice(0, 12)}… unverified: checked by the floor only`);
    assert.ok(s.info.textFloor.measure.draws >= 1024 && !s.info.textFloor.cached);
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
    await assert.rejects(EdgeSession.open({ server: srv.url, pins, acceptBundle: [second.id], refuseUnverified: true }),
      (e) => e instanceof BundleChanged && e.message.includes("and the refuseUnverified option refuses it; trust it with "
        + `the trustedBundles option ${second.id}`));
    assert.deepEqual(srv.state.requests.slice(before), ["/v1/models", "/v1/models"]); // still nothing fetched
    const s2 = await EdgeSession.open({ server: srv.url, pins, acceptBundle: second.id, textFloorCache: false });
    assert.equal(s2.info.bundleId, second.id);
    await s2.close();
    const s3 = await EdgeSession.open({ server: srv.url, pins, trustedBundles: second.id, refuseUnverified: true });
    assert.equal(s3.trust.kind, "trusted");
    assert.equal(s3.info.textFloor, null); // trusted: used as it is
    await s3.close();
    assert.equal(await pins.get(`${srv.url}|m1`), second.id);
    await assert.rejects(EdgeSession.open({ server: srv.url, pins, acceptBundle: "nope" }),
      { message: "acceptBundle: 'nope' is not a bundle id (64 hex digits)" });
  } finally {
    await srv.close();
  }
});
