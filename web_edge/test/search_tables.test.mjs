// The exact search over the designed tables of issue 33: k = 32 and 64 columns whose values
// are already int8-quantized (float32(q) * scale per column). Such a table has many rows at
// exactly equal distances from a midpoint, and its values sit on a per-column grid that the
// int8 candidate pass re-quantizes per row: its bound assumes nothing of the table but float32
// values, so every backend (int8, ort, loop) must still return the float64 brute force's row,
// the lowest on a tie, for queries a tiny random-signed step from the midpoint of a row and
// its nearest other row (and on the midpoint itself: an exact tie).
import assert from "node:assert/strict";
import { test } from "node:test";

import { ExactNearest } from "../dist/search/nearest.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { choiceWithoutReplacement } from "../dist/random/samplers.js";
import { gaussianTable, quantizeInt8 } from "./bundles.mjs";

function brute(table, rows, dim, q) {
  const m = q.length / dim;
  const out = new Int32Array(m);
  for (let i = 0; i < m; i++) {
    let best = -1;
    let bd = Infinity;
    for (let v = 0; v < rows; v++) {
      let d = 0;
      for (let k = 0; k < dim; k++) d += (q[i * dim + k] - table[v * dim + k]) ** 2;
      if (d < bd) {
        bd = d;
        best = v;
      }
    }
    out[i] = best;
  }
  return out;
}

for (const dim of [32, 64]) {
  test(`near-bisector queries on a ${dim}-column int8 table: every backend is the brute force`, async () => {
    const rows = 4400; // the int8 pass is the default from 4,096 rows
    const { q, scale } = quantizeInt8(gaussianTable(rows, dim, 100 + dim), rows, dim);
    const table = Float32Array.from(q, (x, i) => Math.fround(x * scale[i % dim]));
    const rng = new Pcg64Source(dim);
    const picked = choiceWithoutReplacement(rng, rows, 150);
    const loop = await ExactNearest.create(table, rows, dim, null, { backend: "loop" });
    const { rows: other } = await loop.nearestOther(picked);
    const queries = new Float64Array(2 * picked.length * dim);
    picked.forEach((a, i) => {
      const b = other[i];
      for (let k = 0; k < dim; k++) {
        const mid = (table[a * dim + k] + table[b * dim + k]) / 2; // exact in float64
        queries[2 * i * dim + k] = mid; // an exact tie: the lower row
        const step = (rng.nextDouble() < 0.5 ? -1 : 1) * 1e-7 * Math.abs(table[a * dim + k] - table[b * dim + k]);
        queries[(2 * i + 1) * dim + k] = mid + step;
      }
    });
    const want = brute(table, rows, dim, queries);
    // the exact ties do decide for the lower row
    picked.forEach((a, i) => assert.equal(want[2 * i], Math.min(a, other[i])));
    for (const backend of ["int8", "ort", "loop"]) {
      const idx = backend === "loop" ? loop : await ExactNearest.create(table, rows, dim, null, { backend });
      assert.equal(idx.backend, backend);
      assert.deepEqual(await idx.search(queries), want, `${backend}, ${dim} columns`);
      if (backend !== "loop") await idx.release();
    }
    await loop.release();
  });
}
