// PrivbertClient's errors for a page and for the CLI, against a stand-in service (Node's http
// server answering problems), and a page's fetch to another origin that gets no answer: told
// at once, with no retries, as a CORS refusal (the service answers a plain probe) or as a
// service out of reach. The download's progress. (The browser test drives the real thing.)
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, test } from "node:test";

import { PrivbertClient } from "../dist/service/client.js";

let server;
let base;
before(async () => {
  server = createServer((req, res) => {
    const problem = (status, type, title, detail) => {
      res.writeHead(status, { "Content-Type": "application/problem+json" });
      res.end(JSON.stringify({ type: `urn:privbert:problem:${type}`, title, status, detail }));
    };
    if (req.url === "/v1/models") return problem(401, "unauthorized", "Missing or unknown API key", "no such key");
    if (req.url === "/v1/models/m/predict") return problem(403, "budget-exhausted", "Privacy budget exhausted", "the ledger of key k1 has spent 10 of its cap 10");
    if (req.url.startsWith("/v1/bundles/dd")) {  // one piece, then nothing: a stalled download
      res.writeHead(200, { "Content-Type": "application/x-tar", "X-Bundle-Bytes": "300000" });
      res.write(new Uint8Array(1000));
      return setTimeout(() => res.end(), 1500);
    }
    if (req.url.startsWith("/v1/bundles/")) {
      const body = new Uint8Array(300_000).fill(7);
      res.writeHead(200, { "Content-Type": "application/x-tar", "X-Bundle-Bytes": String(body.length) });
      let at = 0;
      const step = () => {  // in pieces, with pauses: the client sees it arrive
        if (at >= body.length) return res.end();
        res.write(body.subarray(at, at + 60_000));
        at += 60_000;
        setTimeout(step, 120);
      };
      return step();
    }
    return problem(404, "not-found", "Not found", "nothing here");
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${server.address().port}`;
});
after(() => server.close());

test("401 and 403 in a web developer's words; the CLI keeps its flags", async () => {
  const page = new PrivbertClient(base, { apiKey: "wrong", retries: 0 });
  await assert.rejects(page.models(), (e) => e.status === 401 && /does not know this API key/.test(e.message)
    && /apiKey/.test(e.message) && !/--api-key/.test(e.message) && e.message.includes(`GET ${base}/v1/models`));
  const none = new PrivbertClient(base, { retries: 0 });
  await assert.rejects(none.models(), /no API key was given/);
  await assert.rejects(page.predict("m", ["{}"]), (e) => e.status === 403 && e.type === "urn:privbert:problem:budget-exhausted"
    && /privacy budget this key, or this device, has on the service is spent/.test(e.message) && /PUT \/admin\/budgets/.test(e.message));
  const cli = new PrivbertClient(base, { apiKey: "wrong", retries: 0, audience: "cli" });
  await assert.rejects(cli.models(), /check --api-key or \$PRIVBERT_API_KEY/);
  // the CLI's words for a spent budget are edge-agent's: what remains, never "may not use"
  await assert.rejects(cli.predict("m", ["{}"]), (e) => /its admin sets the cap/.test(e.message)
    && !/may not use/.test(e.message));
});

function asPage(origin, fn) {
  globalThis.location = { origin, href: `${origin}/app/` };
  return fn().finally(() => { delete globalThis.location; });
}

test("a page's request to another origin without an answer: a CORS refusal at once, no retries", async () => {
  const calls = [];
  // the browser's fetch: CORS refuses the real request; a no-cors probe gets an opaque answer
  const browserFetch = async (url, init) => {
    calls.push(init.mode ?? "cors");
    if (init.mode === "no-cors") return new Response(null, { status: 200 });
    throw new TypeError("Failed to fetch");
  };
  const c = new PrivbertClient("https://api.example.test", { apiKey: "k", retries: 5, fetch: browserFetch });
  const t0 = Date.now();
  await asPage("https://app.example.test", () => assert.rejects(c.models(), (e) => e.type === "cors"
    && /does not allow the origin https:\/\/app\.example\.test/.test(e.message)
    && /PRIVBERT_CORS_ORIGINS=https:\/\/app\.example\.test/.test(e.message)));
  assert.ok(Date.now() - t0 < 1000);
  assert.deepEqual(calls, ["cors", "no-cors"]);  // the call and the probe: no retries
});

test("another origin that answers nothing at all: out of reach, or CORS, said at once", async () => {
  let n = 0;
  const down = async () => { n++; throw new TypeError("Failed to fetch"); };
  const c = new PrivbertClient("https://api.example.test", { retries: 5, fetch: down });
  const t0 = Date.now();
  await asPage("https://app.example.test", () => assert.rejects(c.models(), (e) => e.type === "unreachable"
    && /cannot reach https:\/\/api\.example\.test\/v1\/models from this page/.test(e.message)
    && /PRIVBERT_CORS_ORIGINS/.test(e.message)));
  assert.ok(Date.now() - t0 < 1000 && n === 2);
});

test("the same origin without an answer is retried (a service restarting)", async () => {
  let n = 0;
  const down = async () => { n++; throw new TypeError("Failed to fetch"); };
  const c = new PrivbertClient("https://app.example.test/privbert", { retries: 2, backoff: 0.01, fetch: down });
  await asPage("https://app.example.test", () => assert.rejects(c.models(), /gave up after 3 attempts \(is the service running at https:\/\/app\.example\.test\/privbert\?\)/));
  assert.equal(n, 3);
});

test("the bundle's download reports its progress against X-Bundle-Bytes", async () => {
  const c = new PrivbertClient(base, { retries: 0 });
  const seen = [];
  const bytes = await c.bundleBytes("c".repeat(64), (p) => seen.push(p));
  assert.equal(bytes.length, 300_000);
  assert.ok(seen.length >= 3, JSON.stringify(seen));
  assert.ok(seen.every((p) => p.phase === "download" && p.total === 300_000));
  assert.deepEqual(seen.map((p) => p.loaded), [...seen.map((p) => p.loaded)].sort((a, b) => a - b));
  assert.equal(seen.at(-1).loaded, 300_000);
  assert.ok(bytes.every((b) => b === 7));
});

test("a download that flows longer than the timeout goes on; one that stalls is cut with a message", async () => {
  const c = new PrivbertClient(base, { retries: 0, timeout: 0.4 });  // the body takes 0.6 s
  assert.equal((await c.bundleBytes("c".repeat(64))).length, 300_000);
  await assert.rejects(c.bundleBytes("d".repeat(64)), /the download of .*\/v1\/bundles\/d+ broke off after 1000 bytes/);
});

test("a wrong server or bundle path is one error naming the URL", async () => {
  const c = new PrivbertClient(`${base}/wrong`, { retries: 0 });
  await assert.rejects(c.models(), (e) => e.status === 404 && e.message.startsWith(`GET ${base}/wrong/v1/models: server answered 404`)
    && /is `server` the URL of a privbert service, or of your forwarding backend\?/.test(e.message));
  await assert.rejects(c.bundleBytes("e".repeat(64)), (e) => e.status === 404
    && e.message.startsWith(`GET ${base}/wrong/v1/bundles/${"e".repeat(64)}: server answered 404`));
});
