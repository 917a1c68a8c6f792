// The exact nearest-row search on the queries where a candidate pass is most likely to be wrong:
// points a tiny, random-signed step from the midpoint of a row and its nearest other row (and the
// midpoint itself, an exact tie that goes to the lower row), for every backend (loop, ort, int8),
// against a float64 brute force over the same float32 table. Float32 scores cannot tell these
// rows apart: only a sound candidate bound and the float64 re-rank get them all right.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ExactNearest } from "../dist/search/nearest.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { standardNormal } from "../dist/random/samplers.js";

const ROWS = 600;
const DIM = 24;
const src = new Pcg64Source(5);
// rows of three scales, so that the int8 pass's per-row steps differ
const table = Float32Array.from({ length: ROWS * DIM }, (_, i) => standardNormal(src) * [1, 0.1, 4][Math.floor(i / DIM) % 3]);

function sq(q, qo, v) {
  let d = 0;
  for (let k = 0; k < DIM; k++) d += (q[qo + k] - table[v * DIM + k]) ** 2;
  return d;
}

/** The nearest row of each query (float64 over the float32 rows; ties to the lowest row). */
function brute(q) {
  const out = new Int32Array(q.length / DIM);
  for (let i = 0; i < out.length; i++) {
    let best = -1;
    let bd = Infinity;
    for (let v = 0; v < ROWS; v++) {
      const d = sq(q, i * DIM, v);
      if (d < bd) { bd = d; best = v; }
    }
    out[i] = best;
  }
  return out;
}

/** For each of ``count`` rows x: its nearest other row t, and queries at the midpoint of x and t
 * and at tiny random-signed steps from it, along x − t and along a random direction. */
function nearBisector(count) {
  const q = [];
  for (let n = 0; n < count; n++) {
    const x = Math.floor(src.nextDouble() * ROWS);
    let t = -1;
    let bd = Infinity;
    for (let v = 0; v < ROWS; v++) {
      if (v === x) continue;
      const d = sq(Float64Array.from(table.subarray(x * DIM, (x + 1) * DIM)), 0, v);
      if (d < bd) { bd = d; t = v; }
    }
    const mid = Array.from({ length: DIM }, (_, k) => (table[x * DIM + k] + table[t * DIM + k]) / 2);
    const diff = Array.from({ length: DIM }, (_, k) => table[x * DIM + k] - table[t * DIM + k]);
    const rnd = Array.from({ length: DIM }, () => standardNormal(src));
    const rn = Math.hypot(...rnd);
    q.push(mid);
    for (const h of [1e-6, 1e-8, 1e-10, 1e-12]) {
      const sign = src.nextDouble() < 0.5 ? -1 : 1;
      q.push(mid.map((m, k) => m + sign * h * diff[k]));
      q.push(mid.map((m, k) => m + sign * h * Math.sqrt(bd) * rnd[k] / rn));
    }
  }
  return Float64Array.from(q.flat());
}

const queries = nearBisector(60);
const expected = brute(queries);

for (const backend of ["loop", "ort", "int8"]) {
  test(`near-bisector queries: the float64 brute force's answer, ties to the lower row (${backend})`, async () => {
    const idx = await ExactNearest.create(table, ROWS, DIM, null, { backend, chunk: 64 });
    try {
      assert.equal(idx.backend, backend);
      const got = await idx.search(queries);
      const wrong = [];
      for (let i = 0; i < got.length; i++) if (got[i] !== expected[i]) wrong.push(i);
      assert.deepEqual(wrong, [], `${wrong.length} of ${got.length} queries answered wrong (${backend})`);
      // these are near ties: most of them must have been decided in float64
      assert.ok(idx.lastRerankCount >= got.length / 2, `${idx.lastRerankCount} re-ranked`);
    } finally {
      await idx.release();
    }
  });
}

test("the near-bisector queries are near ties: float32 arithmetic alone gets some wrong", () => {
  let wrong = 0;
  for (let i = 0; i < expected.length; i++) {
    let best = -1;
    let bs = Infinity;
    for (let v = 0; v < ROWS; v++) {
      let s = 0;
      for (let k = 0; k < DIM; k++) s = Math.fround(s + Math.fround(Math.fround(queries[i * DIM + k]) - table[v * DIM + k]) ** 2);
      if (s < bs) { bs = s; best = v; }
    }
    if (best !== expected[i]) wrong++;
  }
  assert.ok(wrong >= 0.1 * expected.length, `float32 got ${wrong} of ${expected.length} wrong`);
});
