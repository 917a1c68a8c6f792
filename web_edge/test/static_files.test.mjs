// staticFiles (@privbert/edge/node), the forwarder template's file server: compressed for the
// browser that accepts it, content-named files immutable, the rest revalidated (a 304), nothing
// outside its folder.
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { brotliDecompressSync } from "node:zlib";

import { contentNamed, staticFiles } from "../dist/node/static_files.js";

let base;
let server;
const JS = "export const x = 1;\n".repeat(500);
before(async () => {
  const dir = mkdtempSync(join(tmpdir(), "privbert-static-"));
  mkdirSync(join(dir, "assets"));
  writeFileSync(join(dir, "index.html"), "<!doctype html><title>p</title>");
  writeFileSync(join(dir, "page.js"), JS);
  writeFileSync(join(dir, "assets", "index-CL3PAaPt.js"), JS);
  writeFileSync(join(dir, "..", "secret.txt"), "not served");
  const serve = staticFiles(dir);
  server = createServer((req, res) => {
    if (!serve(req, res)) res.writeHead(404).end();
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${server.address().port}`;
});
after(() => server.close());

const get = (path, headers = {}) => new Promise((resolve, reject) => {
  import("node:http").then(({ get: g }) => g(base + path, { headers }, (res) => {
    const parts = [];
    res.on("data", (c) => parts.push(c));
    res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(parts) }));
  }).on("error", reject));
});

test("content-named files are immutable; others are revalidated with a 304", async () => {
  const hashed = await get("/assets/index-CL3PAaPt.js", { "accept-encoding": "gzip, br" });
  assert.equal(hashed.status, 200);
  assert.equal(hashed.headers["cache-control"], "public, max-age=31536000, immutable");
  assert.equal(hashed.headers["content-encoding"], "br");
  assert.equal(brotliDecompressSync(hashed.body).toString(), JS);
  assert.ok(hashed.body.length < JS.length / 10);
  const page = await get("/page.js", { "accept-encoding": "gzip" });
  assert.equal(page.headers["cache-control"], "no-cache");
  assert.equal(page.headers["content-encoding"], "gzip");
  assert.ok(page.headers.etag && page.headers["last-modified"]);
  const again = await get("/page.js", { "accept-encoding": "gzip", "if-none-match": page.headers.etag });
  assert.equal(again.status, 304);
  assert.equal(again.body.length, 0);
  const plain = await get("/page.js");
  assert.equal(plain.headers["content-encoding"], undefined);
  assert.equal(plain.body.toString(), JS);
  assert.equal((await get("/")).headers["content-type"], "text/html; charset=utf-8");
});

test("nothing outside the folder, nothing missing", async () => {
  assert.equal((await get("/../secret.txt")).status, 404);
  assert.equal((await get("/%2e%2e/secret.txt")).status, 404);
  assert.equal((await get("/nope.js")).status, 404);
});

test("which names carry a content hash", () => {
  for (const n of ["index-CL3PAaPt.js", "ort-wasm-simd-threaded-DcHrbrbl.wasm", "1a2b3c4d5e6f7a8b.wasm", "page.8c1f2e3a.js"]) {
    assert.ok(contentNamed(n), n);
  }
  for (const n of ["ort-wasm-simd-threaded.wasm", "page.js", "index.html", "privbert-worker.js"]) assert.ok(!contentNamed(n), n);
});
