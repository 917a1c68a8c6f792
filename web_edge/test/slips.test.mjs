// Tests of the kinds a mutation probe of issue 42 found missing (one-line slips no test caught):
// the exact diameter where float32 sums rank two near-tie rows the wrong way, the forwarder's
// authentication when the hook returns an empty string, and a session's string input as a batch
// of one. (The truncation boundary, held to the Python edge's payload, is
// tests/web_edge/test_truncation_boundary.py.)
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import { createTar } from "nanotar";

import { diameter } from "../dist/ledger/exact.js";
import { createForwarder } from "../dist/forwarder.js";
import { EdgeSession } from "../dist/session/session.js";
import { MemoryPinStore } from "../dist/service/pins.js";
import { MemoryLedgerStore } from "../dist/ledger/ledger.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { bundleFiles, englishVocabulary, gaussianTable } from "./bundles.mjs";

// two rows found by search (tests/shared/test_accounting.py has the same): numpy's float32
// row sums say ‖b‖² = 28.729153 > ‖a‖² = 28.72915, the exact sums say ‖a‖² = 28.72915101331762
// > ‖b‖² = 28.72915069045045
const A = [1024237508, 1028595262, 1058048601, 3213958987, 3210399718, 1064778842, 1049529228, 3197298018,
  3188097535, 1058856995, 1049320456, 3207852429, 3214476027, 1061458621, 3214883585, 1073817606, 3214335321,
  3206857298, 1065870338, 1068908352, 1027331581, 3224116451, 3189117946, 3221719536];
const B = A.map((x, i) => (i === 6 ? x + 1 : i === 19 ? x - 1 : x));

test("the diameter is the exact largest norm where float32 sums rank two near-tie rows the wrong way", () => {
  const dim = A.length;
  const rows = [A, B, A.map(() => 0x3f000000)]; // and a small row (0.5 everywhere)
  const t = new Float32Array(new Uint32Array(rows.flat()).buffer);
  const all = Int32Array.from([0, 1, 2]);
  assert.equal(diameter(t, dim, all), 2 * Math.sqrt(28.72915101331762));
  assert.equal(diameter(t, dim, Int32Array.from([1, 2])), 2 * Math.sqrt(28.72915069045045));
  assert.equal(diameter(t, dim, Int32Array.from([1, 0])), 2 * Math.sqrt(28.72915101331762)); // order
});

test("an authenticate hook that returns an empty string is not signed in: 401, nothing forwarded", async () => {
  const seen = [];
  const service = createServer((req, res) => {
    seen.push(req.url);
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end("{\"models\": []}");
  });
  await new Promise((r) => service.listen(0, "127.0.0.1", r));
  try {
    const base = `http://127.0.0.1:${service.address().port}`;
    for (const who of ["", null, undefined]) {
      const f = createForwarder({ service: base, apiKey: "app-key", prefix: "/p", authenticate: () => who });
      const r = await f(new Request("http://app.test/p/v1/models"));
      assert.equal(r.status, 401, JSON.stringify(who));
      assert.equal(r.headers.get("content-type"), "application/problem+json");
    }
    const ok = createForwarder({ service: base, apiKey: "app-key", prefix: "/p", authenticate: () => "user:1" });
    assert.equal((await ok(new Request("http://app.test/p/v1/models"))).status, 200);
    assert.deepEqual(seen, ["/v1/models"]); // only the signed-in request reached the service
  } finally {
    await new Promise((r) => service.close(r));
  }
});

test("privatize(\"a gripping film\") is one payload, byte-identical to the one-element array's for a seed", async () => {
  const vocab = englishVocabulary(1300);
  const files = bundleFiles({ vocab, kind: "float32", values: gaussianTable(vocab.length, 8, 1), dim: 384 });
  const tar = Buffer.concat([createTar(Object.entries(files).filter(([n]) => n !== "id")
    .map(([name, data]) => ({ name, data }))), new Uint8Array(1024)]);
  const server = createServer((req, res) => {
    if (req.url === "/v1/models") {
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ models: [{ id: "m1", mechanism: "dchi-text", params: { eta: 2.0 }, bundle_id: files.id,
        max_length: 64, labels: ["negative", "positive"] }] }));
    } else {
      res.writeHead(200, { "Content-Type": "application/x-tar" });
      res.end(tar);
    }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  try {
    const url = `http://127.0.0.1:${server.address().port}`;
    const open = () => EdgeSession.open({ server: url, pins: new MemoryPinStore(), ledger: new MemoryLedgerStore(),
      trustedBundles: files.id });
    const [one, list] = [await open(), await open()];
    const a = await one.privatize("a gripping film", new Pcg64Source(7));
    const b = await list.privatize(["a gripping film"], new Pcg64Source(7));
    assert.equal(a.length, 1);
    assert.equal(a[0].payload, b[0].payload);
    assert.equal(a[0].tokens, b[0].tokens);
    assert.deepEqual(a[0].cost, b[0].cost);
    const two = await list.privatize(["a gripping film", "a dull plot"], new Pcg64Source(7));
    assert.equal(two.length, 2); // and a list is a list
    await one.close();
    await list.close();
  } finally {
    await new Promise((r) => server.close(r));
  }
});
