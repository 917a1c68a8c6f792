// What the start of a bundle tarball tells before the rest arrives (bundle.json is its first
// file): the table's shape, so that a page starts onnxruntime-web only where the bundle needs
// it (warmUp); a hint only, never trusted for anything else.
import assert from "node:assert/strict";
import { test } from "node:test";

import { createTar } from "nanotar";

import { peekBundleShape } from "../dist/bundle/bundle.js";
import { runtimeNeeded } from "../dist/runtime/warm_up.js";

const enc = (o) => new TextEncoder().encode(JSON.stringify(o));

function tarball(meta, first = "bundle.json") {
  const files = { [first]: enc(meta), "table.npy": new Uint8Array(5000), "tokenizer.json": enc({}) };
  return createTar(Object.entries(files).map(([name, data]) => ({ name, data })));
}

test("the shape is told once bundle.json has arrived, not before", () => {
  const meta = { vocab_size: 30522, dim: 384, table: { dim: 32, name: "pca32-int8" }, encoder: null, pad: "x".repeat(900) };
  const tar = tarball(meta);
  const size = enc(meta).length;
  assert.equal(peekBundleShape(tar, 0), null);
  assert.equal(peekBundleShape(tar, 511), null);
  assert.equal(peekBundleShape(tar, 512 + size - 1), null);
  assert.deepEqual(peekBundleShape(tar, 512 + size), { rows: 30522, dim: 32, encoder: false });
  // the model's own table (no designed one), with an encoder
  const own = tarball({ vocab_size: 30522, dim: 384, table: null, encoder: { file: "encoder.onnx" } });
  assert.deepEqual(peekBundleShape(own, own.length), { rows: 30522, dim: 384, encoder: true });
});

test("a tarball that does not start with a readable bundle.json tells nothing", () => {
  const meta = { vocab_size: 30522, dim: 384 };
  assert.equal(peekBundleShape(tarball(meta, "a.json"), 4096), undefined);
  const broken = tarball(meta);
  broken[512] = 0x7b; broken[513] = 0x7b;  // "{{": not JSON
  assert.equal(peekBundleShape(broken, broken.length), undefined);
  assert.equal(peekBundleShape(tarball({ vocab_size: -1, dim: 384 }), 4096), undefined);
});

test("onnxruntime-web is needed by an encoder mechanism or a search over a large table only", () => {
  const compact = { rows: 30522, dim: 32, encoder: false };
  const minilm = { rows: 30522, dim: 384, encoder: false };
  assert.equal(runtimeNeeded(compact, "dchi-text"), false);
  assert.equal(runtimeNeeded(minilm, "dchi-text"), true);
  assert.equal(runtimeNeeded(compact, "laplace"), true);
  assert.equal(runtimeNeeded({ ...compact, encoder: true }, "dchi-text"), false);
  assert.equal(runtimeNeeded({ ...compact, encoder: true }), true);
});
