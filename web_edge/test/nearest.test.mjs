// The exact nearest-row search: the float32 and int8 candidate passes and the float64 re-rank
// agree with a float64 brute force on random tables and on adversarial near ties, with every
// product; the int8 pass hands a query with too many candidates to the float32 pass.
import assert from "node:assert/strict";
import { test } from "node:test";

import { integerGemmIsExact } from "../dist/search/int8_pass.js";
import { ExactNearest, LARGE_WORK, nextUpF32, searchUsesOrt, UPGRADE_WORK } from "../dist/search/nearest.js";
import { loadOrt } from "../dist/runtime/ort.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { LoopTableProduct } from "../dist/search/table_product.js";
import { standardNormal } from "../dist/random/samplers.js";

function brute(table, rows, dim, q) {
  const m = q.length / dim;
  const out = new Int32Array(m);
  for (let i = 0; i < m; i++) {
    let best = -1, bd = Infinity;
    for (let v = 0; v < rows; v++) {
      let d = 0;
      for (let k = 0; k < dim; k++) d += (q[i * dim + k] - table[v * dim + k]) ** 2;
      if (d < bd) { bd = d; best = v; }
    }
    out[i] = best;
  }
  return out;
}

function randomTable(rows, dim, seed, scale = 1) {
  const src = new Pcg64Source(seed);
  return Float32Array.from({ length: rows * dim }, () => scale * standardNormal(src));
}

for (const backend of ["loop", "ort", "int8"]) {
  test(`random tables and queries: the brute-force answer (${backend})`, async () => {
    const rows = 500, dim = 24;
    const table = randomTable(rows, dim, 1);
    const src = new Pcg64Source(2);
    const q = Float64Array.from({ length: 300 * dim }, () => 1.5 * standardNormal(src));
    const idx = await ExactNearest.create(table, rows, dim, null, { backend, chunk: 64 });
    assert.deepEqual(await idx.search(q), brute(table, rows, dim, q));
    await idx.release();
  });

  test(`near ties decided in float64, ties to the lowest row (${backend})`, async () => {
    const dim = 8;
    // rows 0 and 1 differ by one float32 ulp in one coordinate; rows 2 and 3 are equal
    const base = Float32Array.from({ length: dim }, (_, k) => 0.25 + k / 16);
    const a = Float32Array.from(base);
    const b = Float32Array.from(base);
    b[3] = nextUpF32(b[3]);
    const table = new Float32Array(6 * dim);
    table.set(a, 0); table.set(b, dim); table.set(base.map((x) => -x), 2 * dim);
    table.set(base.map((x) => -x), 3 * dim); table.set(base.map((x) => x + 5), 4 * dim); table.set(base.map((x) => 3 * x), 5 * dim);
    const q = new Float64Array(4 * dim);
    for (let k = 0; k < dim; k++) {
      q[k] = a[k]; // exactly row 0
      q[dim + k] = b[k]; // exactly row 1: one ulp away from row 0
      q[2 * dim + k] = -base[k] + 1e-9; // equidistant from rows 2 and 3: the lower one
      q[3 * dim + k] = (a[k] + b[k]) / 2 + (k === 3 ? 1e-12 : 0); // nearer row 1 by a hair
    }
    const idx = await ExactNearest.create(table, 6, dim, Int32Array.of(10, 11, 12, 13, 14, 15), { backend });
    const got = await idx.search(q);
    assert.deepEqual(Array.from(got), [10, 11, 12, 11]);
    assert.ok(idx.lastRerankCount >= 3); // the ties went to the float64 re-rank
    await idx.release();
  });
}

test("a too-small bound would fail: the search needs its re-rank", async () => {
  // two rows whose float32 scores tie for a query nearer the second: the float32 argmin alone
  // (the first) is wrong, the exact search is right
  const dim = 4;
  const t = Float32Array.of(1, 1, 1, 1, 1, 1, 1, nextUpF32(1));
  const q = Float64Array.of(1, 1, 1, 1 + 2 ** -22);
  const idx = await ExactNearest.create(t, 2, dim, null, { backend: "loop" });
  assert.deepEqual(Array.from(await idx.search(q)), [1]);
  const s = await idx.scores(q, 1);
  assert.ok(s[0] <= s[1]); // float32 alone would pick row 0
});

test("NaN, Inf and overflowing queries are refused", async () => {
  const idx = await ExactNearest.create(randomTable(10, 4, 0), 10, 4, null, { backend: "loop" });
  await assert.rejects(idx.search(Float64Array.of(0, Number.NaN, 0, 0)), /NaN or Inf/);
  await assert.rejects(idx.search(Float64Array.of(0, 1e38, 1e38, 0)), /too large/);
  await assert.rejects(idx.search(Float64Array.of(0, 1, 0)), /shape/);
});

test("onnxruntime-web's integer kernel is exact here for both operand kinds (else no int8 pass)", async () => {
  const ort = await loadOrt();
  for (const signed of [false, true]) assert.equal(await integerGemmIsExact(ort, signed, 384), true);
});

test("int8 pass: rows of very different scales", async () => {
  const rows = 4200, dim = 16;
  const src = new Pcg64Source(7);
  // each row scaled by 10^k, k in [-3, 3]: the per-row steps and bounds must hold for all
  const table = Float32Array.from({ length: rows * dim }, (_, i) =>
    standardNormal(src) * 10 ** ((Math.floor(i / dim) % 7) - 3));
  const q = Float64Array.from({ length: 120 * dim }, (_, i) => 2 * standardNormal(src) * 10 ** ((i % 5) - 2));
  const idx = await ExactNearest.create(table, rows, dim, null, { backend: "int8", chunk: 50 });
  assert.equal(idx.backend, "int8");
  assert.deepEqual(await idx.search(q), brute(table, rows, dim, q));
  await idx.release();
});

test("auto: the int8 pass from LARGE_WORK multiply-adds a query; below, where onnxruntime-web is at hand (Node), from UPGRADE_WORK; else the loop", async () => {
  // by work per query (rows × dim), not rows: the 384-d MiniLM table runs on onnxruntime-web,
  // the compact pca32-int8 one (29,523 regular rows × 32) is plain JS in a page that has not
  // started onnxruntime-web (no WebAssembly to fetch; tests/cloud_api: the browser tests)
  assert.equal(searchUsesOrt(29523, 384), true);
  assert.equal(searchUsesOrt(29523, 32), false);
  assert.ok(29523 * 32 >= UPGRADE_WORK);
  const dim = 256, rows = LARGE_WORK / dim;
  const table = randomTable(rows, dim, 11);
  const q = Float64Array.from({ length: 8 * dim }, (_, i) => table[(i * 37) % table.length] + 0.3 * Math.sin(i));
  for (const [n, want] of [[rows, "int8"], [rows - 1, "int8"], [UPGRADE_WORK / dim - 1, "loop"]]) {
    const idx = await ExactNearest.create(table.subarray(0, n * dim), n, dim, null, {});
    assert.equal(idx.backend, want, `${n} rows × ${dim}`);
    assert.deepEqual(await idx.search(q), brute(table, n, dim, q));
    await idx.release();
  }
});

test("int8 pass: a query with more candidates than the cap takes the float32 pass", async () => {
  // 300 identical rows (over the cap of 256) and a few others: the query on them ties them all
  const dim = 8, rows = 310;
  const src = new Pcg64Source(3);
  const table = new Float32Array(rows * dim);
  for (let v = 0; v < rows; v++) {
    for (let k = 0; k < dim; k++) table[v * dim + k] = v < 5 || v >= 305 ? standardNormal(src) : 0.5;
  }
  // the first query ties the 300; the second is one of the other rows (a single candidate)
  const q = Float64Array.from({ length: 2 * dim }, (_, i) => (i < dim ? 0.5 + 1e-3 : table[307 * dim + i - dim]));
  const idx = await ExactNearest.create(table, rows, dim, null, { backend: "int8" });
  const got = await idx.search(q);
  assert.deepEqual(got, brute(table, rows, dim, q));
  assert.deepEqual(Array.from(got), [5, 307]); // the lowest of the tied rows; the row itself
  assert.equal(idx.lastFallbackCount, 1);
  await idx.release();
});

test("the plain loop scores four queries per pass exactly as one query alone", async () => {
  const rows = 97, dim = 13, width = 16;
  const table = randomTable(rows, dim, 5);
  const norms = Float64Array.from({ length: rows }, (_, v) => {
    let n = 0;
    for (let k = 0; k < dim; k++) n += table[v * dim + k] ** 2;
    return n;
  });
  const loop = new LoopTableProduct(table, norms, rows, dim, width);
  const m = 7; // one block of four, three alone
  const src = new Pcg64Source(9);
  const y = new Float32Array(m * width);
  for (let i = 0; i < m; i++) {
    for (let k = 0; k < dim; k++) y[i * width + k] = standardNormal(src);
    y[i * width + dim] = i % 2;
  }
  const all = await loop.run(y, m);
  for (let i = 0; i < m; i++) {
    const one = await loop.run(y.subarray(i * width, (i + 1) * width), 1);
    assert.deepEqual(all.subarray(i * rows, (i + 1) * rows), one, `query ${i}`);
  }
});
