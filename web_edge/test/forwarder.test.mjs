// The forwarder (@privbert/edge/forwarder) against a stand-in service (Node's http server that
// records what reaches it): no session is the forwarder's own 401; only GET /v1/models,
// GET /v1/bundles/{id} and POST predict bodies of well-formed payloads are forwarded, rebuilt
// from their checked parts, with the key added; everything else is a 4xx problem and nothing
// reaches the service.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import { createForwarder, payloadBody } from "../dist/forwarder.js";

const BUNDLE = "ab".repeat(32);
const PAYLOAD = { version: 1, mechanism: "dchi-text", params: { eta: 65 }, bundle_id: BUNDLE,
  token_ids: { dtype: "int32", shape: [2], data: "AQAAAAIAAAA=" } };

let service;
let seen;
let base;
before(async () => {
  seen = [];
  service = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => { body += c; });
    req.on("end", () => {
      seen.push({ method: req.method, url: req.url, auth: req.headers.authorization, device: req.headers["x-device-id"], body });
      res.writeHead(200, { "Content-Type": "application/json", "X-Privacy-Budget-Remaining": "9", "Set-Cookie": "no=1" });
      res.end(JSON.stringify({ predictions: [{ label: "positive", scores: { negative: 0.1, positive: 0.9 } }] }));
    });
  });
  await new Promise((r) => service.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${service.address().port}`;
});
after(() => service.close());

function forwarder(extra = {}) {
  const log = [];
  const f = createForwarder({ service: base, apiKey: "app-key", prefix: "/privbert", deviceIds: true,
    authenticate: (r) => (r.headers.get("cookie") === "sid=ok" ? "user:42" : null), log: (l) => log.push(l), ...extra });
  return { f, log };
}

function req(path, init = {}) {
  return new Request(`http://app.test${path}`, init);
}

const signedIn = { cookie: "sid=ok" };
const json = { ...signedIn, "content-type": "application/json" };

test("a payload body is forwarded rebuilt, with the key and the user's device id", async () => {
  const { f, log } = forwarder();
  seen.length = 0;
  const body = JSON.stringify({ payloads: [PAYLOAD] });
  const r = await f(req("/privbert/v1/models/sst2/predict", { method: "POST", headers: { ...json, authorization: "Bearer page-key" }, body }));
  assert.equal(r.status, 200);
  assert.equal(r.headers.get("x-privacy-budget-remaining"), "9");
  assert.equal(r.headers.get("set-cookie"), null);  // the service's other headers stay behind
  assert.equal(seen.length, 1);
  assert.equal(seen[0].url, "/v1/models/sst2/predict");
  assert.equal(seen[0].auth, "Bearer app-key");  // the page's own Authorization is not passed on
  assert.equal(seen[0].device, "user:42");
  assert.deepEqual(JSON.parse(seen[0].body), { payloads: [PAYLOAD] });
  assert.deepEqual(log.map((l) => [l.method, l.route, l.status]), [["POST", "/v1/models/{id}/predict", 200]]);
  assert.ok(!JSON.stringify(log).includes("AQAAAAIAAAA"));  // never a body in the log
});

test("GET models and bundles are forwarded; other paths and methods are refused", async () => {
  const { f } = forwarder();
  seen.length = 0;
  assert.equal((await f(req("/privbert/v1/models", { headers: signedIn }))).status, 200);
  assert.equal((await f(req(`/privbert/v1/bundles/${BUNDLE}`, { headers: signedIn }))).status, 200);
  assert.deepEqual(seen.map((s) => s.url), ["/v1/models", `/v1/bundles/${BUNDLE}`]);
  seen.length = 0;
  for (const [path, method, status] of [["/privbert/admin/budgets", "GET", 404], ["/privbert/v1/records", "POST", 404],
    ["/privbert/v1/bundles/xyz", "GET", 404], ["/other/v1/models", "GET", 404], ["/privbert/v1/models", "DELETE", 405],
    ["/privbert/v1/models/sst2/predict", "GET", 405]]) {
    const r = await f(req(path, { method, headers: json, body: method === "POST" ? "{}" : undefined }));
    assert.equal(r.status, status, path);
    assert.equal(r.headers.get("content-type"), "application/problem+json");
    assert.match((await r.json()).type, /^urn:privbert:forwarder:/);
  }
  assert.equal(seen.length, 0);
});

test("no session is the forwarder's 401 and nothing reaches the service", async () => {
  const { f } = forwarder();
  seen.length = 0;
  const r = await f(req("/privbert/v1/models/sst2/predict", { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ payloads: [PAYLOAD] }) }));
  assert.equal(r.status, 401);
  assert.equal((await r.json()).type, "urn:privbert:forwarder:no-session");
  assert.equal(seen.length, 0);
});

test("bodies that are not payloads are refused (422, 413, 415) and not forwarded", async () => {
  const { f } = forwarder({ maxBodyBytes: 4096, models: ["sst2"] });
  seen.length = 0;
  const bad = [
    { texts: ["my secret sentence"] },
    { payloads: [{ ...PAYLOAD, text: "my secret sentence" }] },
    { payloads: [PAYLOAD], note: "my secret sentence" },
    { payloads: [{ ...PAYLOAD, mechanism: "none" }] },
    { payloads: [{ ...PAYLOAD, params: { eta: "my secret sentence" } }] },
    { payloads: [{ ...PAYLOAD, token_ids: { ...PAYLOAD.token_ids, data: "my secret sentence" } }] },
    { payloads: [{ ...PAYLOAD, token_ids: { ...PAYLOAD.token_ids, shape: [3] } }] },
    { payloads: [{ ...PAYLOAD, bundle_id: "my secret sentence" }] },
    { payloads: [] },
  ];
  for (const b of bad) {
    const r = await f(req("/privbert/v1/models/sst2/predict", { method: "POST", headers: json, body: JSON.stringify(b) }));
    assert.equal(r.status, 422, JSON.stringify(b));
    const problem = await r.json();
    assert.equal(problem.type, "urn:privbert:forwarder:not-a-payload");
    assert.ok(!problem.detail.includes("secret"), problem.detail);  // never echoes the input
  }
  const big = await f(req("/privbert/v1/models/sst2/predict", { method: "POST", headers: json, body: "x".repeat(5000) }));
  assert.equal(big.status, 413);
  const text = await f(req("/privbert/v1/models/sst2/predict", { method: "POST", headers: { ...signedIn, "content-type": "text/plain" }, body: "{}" }));
  assert.equal(text.status, 415);
  const other = await f(req("/privbert/v1/models/other/predict", { method: "POST", headers: json, body: JSON.stringify({ payloads: [PAYLOAD] }) }));
  assert.equal(other.status, 404);
  assert.equal(seen.length, 0);
});

test("a service that does not answer is a 502 from the forwarder", async () => {
  const f = createForwarder({ service: "http://127.0.0.1:9", apiKey: "k", authenticate: () => "u", prefix: "/p" });
  const r = await f(req("/p/v1/models"));
  assert.equal(r.status, 502);
  assert.equal((await r.json()).type, "urn:privbert:forwarder:service-unreachable");
});

test("payloadBody keeps each mechanism's fields and nothing else", () => {
  const ome = { mechanism: "ome", params: { epsilon: 1, lam: 2, int_bits: 4, frac_bits: 5 }, bundle_id: BUNDLE,
    bits: { dtype: "bits", shape: [10], data: "AAA=" } };
  assert.deepEqual(JSON.parse(payloadBody(JSON.stringify({ payloads: [ome] }))).payloads[0], { version: 1, ...ome });
  const pair = { ...PAYLOAD, segments: [1, 1] };
  assert.deepEqual(JSON.parse(payloadBody(JSON.stringify({ payloads: [pair] }))).payloads[0], pair);
  assert.throws(() => payloadBody(JSON.stringify({ payloads: [{ ...pair, segments: [1, 2, 3] }] })), /segments/);
  assert.throws(() => payloadBody("not json"), /not JSON/);
  assert.throws(() => createForwarder({ service: "ftp://x", apiKey: "k", authenticate: () => "u" }), RangeError);
  assert.throws(() => createForwarder({ service: "http://x", apiKey: "", authenticate: () => "u" }), RangeError);
});

test("a GET goes back gzip to a page that accepts it (a bundle's copy made once), with the service's validators", async () => {
  const tar = new Uint8Array(200_000).map((_, i) => (i * 7) % 13);  // compressible, as a bundle's tokenizer is
  const calls = [];
  const fake = async (url, init) => {
    calls.push({ url, encoding: init.headers["Accept-Encoding"] });
    return new Response(tar, { status: 200, headers: { "content-type": "application/x-tar", etag: `"${BUNDLE}"`,
      "cache-control": "private, max-age=31536000, immutable", "x-bundle-bytes": String(tar.length) } });
  };
  const { f } = forwarder({ fetch: fake });
  const get = () => f(req(`/privbert/v1/bundles/${BUNDLE}`, { headers: { ...signedIn, "accept-encoding": "gzip, br" } }));
  for (let round = 0; round < 2; round++) {
    const r = await get();
    assert.equal(r.status, 200);
    assert.equal(r.headers.get("content-encoding"), "gzip");
    assert.equal(r.headers.get("etag"), `"${BUNDLE}"`);
    assert.equal(r.headers.get("cache-control"), "private, max-age=31536000, immutable");
    assert.equal(r.headers.get("x-bundle-bytes"), String(tar.length));
    const packed = new Uint8Array(await r.arrayBuffer());
    assert.ok(packed.length < tar.length / 4, `${packed.length} bytes`);
    assert.equal(Number(r.headers.get("content-length")), packed.length);
    const back = new Uint8Array(await new Response(new Blob([packed]).stream().pipeThrough(new DecompressionStream("gzip"))).arrayBuffer());
    assert.deepEqual(back, tar);
  }
  assert.deepEqual(calls.map((c) => c.encoding), ["identity", "identity"]);  // the service is asked as before
  const plain = await f(req(`/privbert/v1/bundles/${BUNDLE}`, { headers: { ...signedIn, "accept-encoding": "identity" } }));
  assert.equal(plain.headers.get("content-encoding"), null);
  assert.deepEqual(new Uint8Array(await plain.arrayBuffer()), tar);
});
