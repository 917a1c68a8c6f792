// No Math.random anywhere in the library: noise must come from crypto.getRandomValues (or a
// seeded generator the caller passes). Fails on any occurrence in src/.
import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

function files(dir) {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? files(p) : [p];
  });
}

test("src/ never calls Math.random", () => {
  const src = new URL("../src", import.meta.url).pathname;
  const hits = files(src).filter((f) => /\bMath\s*\.\s*random\b|\bMath\s*\[\s*["']random["']\s*\]/.test(readFileSync(f, "utf8")));
  assert.deepEqual(hits, []);
  assert.ok(files(src).length > 10); // the scan saw the library
});

test("the check itself catches a Math.random call", () => {
  assert.ok(/\bMath\s*\.\s*random\b/.test("const x = Math.random();"));
});
