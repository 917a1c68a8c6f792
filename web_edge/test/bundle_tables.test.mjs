// The bundle's privatization table (shared/table.py, shared/bundle.py): embeddings.npy, or a
// designed float32 or int8 table, read and checked whole by EdgeBundle.fromFiles; an int8
// table is its dequantized values float32(q) * scale; a table that does not match its hash,
// dtype, shape or scale, or from which the id cannot be reproduced, is refused in one line.
import assert from "node:assert/strict";
import { test } from "node:test";

import { EdgeBundle } from "../dist/bundle/bundle.js";
import { BundleError } from "../dist/errors.js";
import { npyHeader } from "../dist/bundle/npy.js";
import { Privatizer } from "../dist/mechanisms/privatizer.js";
import { pyDumps } from "../dist/format/pyjson.js";
import { bundleFiles, gaussianTable, npy, quantizeInt8, reader, sha256, vocabulary } from "./bundles.mjs";

const VOCAB = vocabulary(64, ["the", "movie", "was", "good", "bad", "plot", "fun", "dull"]);
const V = VOCAB.length;

function load(files, where = "b") {
  return EdgeBundle.fromFiles(reader(files), where);
}

async function refused(files, pattern) {
  await assert.rejects(load(files), (e) => {
    assert.ok(e instanceof BundleError, e);
    assert.match(e.message, pattern);
    assert.ok(!e.message.includes("\n"));
    return true;
  });
}

test("the original layout: the table is the model's embeddings", async () => {
  const values = gaussianTable(V, 16, 1);
  const b = await load(bundleFiles({ vocab: VOCAB, values }));
  assert.equal(b.tableDim, 16);
  assert.equal(b.hasEmbeddings, true);
  assert.deepEqual(b.table, values);
  assert.equal(b.embeddings, b.table);
  assert.equal(b.tableName, "none");
  assert.equal(b.describeTable(), "table none: the model's 16-d word embeddings (test), float32");
});

test("a float32 designed table: dchi-text over it, no model embeddings", async () => {
  const values = gaussianTable(V, 8, 2);
  const files = bundleFiles({ vocab: VOCAB, kind: "float32", values, dim: 384 });
  const b = await load(files);
  assert.equal(b.bundleId, files.id);
  assert.equal(b.dim, 384); // the model's
  assert.equal(b.tableDim, 8);
  assert.deepEqual(b.table, values);
  assert.equal(b.hasEmbeddings, false);
  assert.throws(() => b.embeddings, (e) => e instanceof BundleError
    && e.message === `bundle ${files.id.slice(0, 12)}… carries the privatization table pca8 (8 dimensions), not the `
      + "model's word embeddings: it serves dchi-text only (dchi-embedding needs a bundle with the model's table, "
      + "e.g. cloud-api export-bundle --table none)");
  assert.equal(b.describeTable(), "table pca8: the top 8 principal components of the model's 384-d word embeddings (test), float32");
  // the diameter and the norms are the table's
  let top = 0;
  for (const r of b.regularIds) {
    let s = 0;
    for (let k = 0; k < 8; k++) s += values[r * 8 + k] ** 2;
    top = Math.max(top, s);
  }
  assert.equal(b.regularMaxNorm, Math.sqrt(top));
  await assert.rejects(Privatizer.create(b, { mechanism: "dchi-embedding", eta: 5 }), BundleError);
});

test("an int8 table is float32(q) * scale, one rounding, exactly numpy's", async () => {
  const raw = gaussianTable(V, 8, 3);
  const { q, scale } = quantizeInt8(raw, V, 8);
  scale[3] = 0.1; // not a power of two: q * s rounds
  const b = await load(bundleFiles({ vocab: VOCAB, kind: "int8", q, scale }));
  const f32 = new Float32Array(1);
  for (let i = 0; i < V * 8; i++) {
    f32[0] = q[i] * scale[i % 8]; // the double product is exact (8 by 24 bits), then one rounding
    assert.equal(b.table[i], f32[0]);
  }
  assert.equal(b.table[3], Math.fround(q[3] * Math.fround(0.1)));
  assert.equal(b.tableInfo.dtype, "int8");
});

test("a designed table is checked whole: dtype, shape, scale, files, hash, the id reproduced", async () => {
  const values = gaussianTable(V, 8, 4);
  const { q, scale } = quantizeInt8(values, V, 8);
  // the stored dtype is not the one the block states
  const asF32 = bundleFiles({ vocab: VOCAB, kind: "int8", q, scale });
  await refused(bundleFiles({ vocab: VOCAB, kind: "float32", values, tableBlock: { dtype: "int8", scale_file: "table_scale.npy" },
    extraFiles: { "table_scale.npy": asF32["table_scale.npy"] } }), /^b\/table\.npy: dtype float32 is not the int8 bundle\.json describes$/);
  await refused(bundleFiles({ vocab: VOCAB, kind: "float32", values, tableBlock: { dim: 9 } }),
    /^b\/table\.npy: shape \(64, 8\) does not match \(64, 9\) in bundle\.json$/);
  await refused(bundleFiles({ vocab: VOCAB, kind: "float32", values, tableBlock: { dtype: "float16" } }),
    /^b\/bundle\.json: the table's dtype 'float16' or dim 8 is not one this edge reads \(float32 or int8, dim >= 1\)$/);
  await refused(bundleFiles({ vocab: VOCAB, kind: "float32", values, tableBlock: { dim: 0 } }),
    /the table's dtype 'float32' or dim 0 is not one this edge reads/);
  await refused(bundleFiles({ vocab: VOCAB, kind: "float32", values, tableBlock: { file: "other.npy" } }),
    /^b\/bundle\.json: the table must be stored in table\.npy$/);
  await refused(bundleFiles({ vocab: VOCAB, kind: "float32", values, meta: { table: [1] } }),
    /^b\/bundle\.json: its table block is not an object$/);
  // int8: the scale file is needed, with its shape and finite positive values
  await refused(bundleFiles({ vocab: VOCAB, kind: "int8", q, scale, tableBlock: { scale_file: undefined } }),
    /^b\/bundle\.json: an int8 table needs its table_scale\.npy$/);
  for (const bad of [0, -1, NaN, Infinity]) {
    const s = Float32Array.from(scale);
    s[5] = bad;
    await refused(bundleFiles({ vocab: VOCAB, kind: "int8", q, scale: s }),
      /^b\/table_scale\.npy: the table's scale must be finite and > 0 in every column$/);
  }
  const shaped = bundleFiles({ vocab: VOCAB, kind: "int8", q, scale });
  shaped["table_scale.npy"] = npy("<f4", [8, 1], scale);
  await refused(withHashes(shaped), /^b\/table_scale\.npy: shape \(8, 1\) does not match \(8,\) in bundle\.json$/);
  // non-finite values in a float32 table
  const nan = Float32Array.from(values);
  nan[77] = NaN;
  await refused(bundleFiles({ vocab: VOCAB, kind: "float32", values: nan }), /^b\/table\.npy: the table has non-finite values$/);
  // a scale file on a float32 table, an extra file, a table block that is falsy but hashed, a
  // header numpy would not write: the id cannot be reproduced from the contents
  const f = bundleFiles({ vocab: VOCAB, kind: "float32", values, tableBlock: { scale_file: "table_scale.npy" } });
  await refused(f, new RegExp(`^b: contents do not reproduce bundle_id ${f.id}$`));
  await refused(bundleFiles({ vocab: VOCAB, kind: "float32", values, extraFiles: { "notes.txt": new Uint8Array([1]) } }),
    /contents do not reproduce bundle_id/);
  await refused(bundleFiles({ vocab: VOCAB, values, dim: 8, meta: { table: {} } }), /contents do not reproduce bundle_id/);
  const v2 = bundleFiles({ vocab: VOCAB, kind: "float32", values });
  const head = npyHeader("<f4", [V, 8]);
  const body = v2["table.npy"].subarray(head.length);
  const hdr2 = new Uint8Array(12 + head.length - 10);
  hdr2.set([0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 2, 0]);
  new DataView(hdr2.buffer).setUint32(8, head.length - 10, true);
  hdr2.set(head.subarray(10), 12);
  const file2 = new Uint8Array(hdr2.length + body.length);
  file2.set(hdr2);
  file2.set(body, hdr2.length);
  v2["table.npy"] = file2;
  await refused(withHashes(v2), /contents do not reproduce bundle_id/);
  // a bit flipped in the table: its hash
  const flip = bundleFiles({ vocab: VOCAB, kind: "int8", q, scale });
  flip["table.npy"] = Uint8Array.from(flip["table.npy"]);
  flip["table.npy"][200] ^= 1;
  await refused(flip, /^b\/table\.npy: content does not match its hash in bundle\.json \(corrupted or modified\); fetch the bundle again$/);
  // the table file is not listed
  const unlisted = bundleFiles({ vocab: VOCAB, kind: "float32", values });
  await refused(withHashes(unlisted, ["table.npy"]), /^b\/bundle\.json: does not list table\.npy$/);
});

/** Rewrite bundle.json's file hashes (and the id) after a file was replaced on purpose;
 * ``drop``: names left out of the list. */
function withHashes(files, drop = []) {
  const meta = JSON.parse(new TextDecoder().decode(files["bundle.json"]));
  const names = Object.keys(files).filter((n) => n !== "bundle.json" && n !== "id" && !drop.includes(n)).sort();
  meta.files = Object.fromEntries(names.map((n) => [n, sha256(files[n])]));
  const rebuilt = bundleFilesFromMeta(meta);
  return { ...files, "bundle.json": rebuilt.bytes, id: rebuilt.id };
}

function bundleFilesFromMeta(meta) {
  const keys = ["format", "format_version", "vocab_size", "dim", "max_length", "special_ids", "unused_ids", "encoder", "files"];
  const hashed = Object.fromEntries(keys.map((k) => [k, meta[k] ?? null]));
  if (meta.table !== undefined && meta.table !== null) hashed.table = meta.table;
  meta.bundle_id = sha256(pyDumps(hashed));
  return { bytes: new TextEncoder().encode(JSON.stringify(meta)), id: meta.bundle_id };
}
