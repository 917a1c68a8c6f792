// No call of the global Math object's non-cryptographic generator anywhere in the library:
// noise must come from crypto.getRandomValues (or a seeded generator the caller passes).
// The generator's name is assembled at run time, so this file does not contain it either.
import assert from "node:assert/strict";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

const NAME = ["ran", "dom"].join("");
const CALL = new RegExp(`\\bMath\\s*\\.\\s*${NAME}\\b|\\bMath\\s*\\[\\s*["']${NAME}["']\\s*\\]`);

function files(dir) {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? files(p) : [p];
  });
}

test("src/ never calls the non-cryptographic generator", () => {
  const src = new URL("../src", import.meta.url).pathname;
  const hits = files(src).filter((f) => CALL.test(readFileSync(f, "utf8")));
  assert.deepEqual(hits, []);
  assert.ok(files(src).length > 10); // the scan saw the library
});

test("the check itself catches such a call, in both spellings", () => {
  assert.ok(CALL.test(`const x = Math.${NAME}();`));
  assert.ok(CALL.test(`const x = Math["${NAME}"]();`));
  assert.ok(!CALL.test("crypto.getRandomValues(buf);"));
});
