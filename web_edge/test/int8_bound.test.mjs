// The int8 candidate pass's bound (src/search/int8_pass.ts, shared/mechanisms/int8_pass.py step 4) against
// the worst error measured on data built to reach it: |s − (o + δ)| ≤ r_j(y) for every query and
// row, where s = ‖t‖² − 2 y·t in float64, and r_j(y) = 2‖e‖‖t‖ + 2‖ŷ‖‖f‖ + γ4 (2‖ŷ‖‖t̂‖ + |β|).
// Each family of data makes one term of the bound nearly tight, so a bound that drops or shrinks
// a term fails the first check, and one that grows it fails the second (the worst error must
// reach at least the stated share of the bound).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Int8CandidatePass } from "../dist/search/int8_pass.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { standardNormal } from "../dist/random/samplers.js";

const DIM = 32;
const N = 48; // rows of each family
const SLACK = 2 ** -36; // the float64 rounding the pass allows for (its step 6)

const src = new Pcg64Source(11);
const int = (lo, hi) => lo + Math.floor(src.nextDouble() * (hi - lo + 1));
/** Random integers in [−127, 127], one of them ±127 (so the vector's largest entry is 127). */
function ints(first = 0) {
  const p = Array.from({ length: DIM }, () => int(-127, 127));
  p[first + int(0, DIM - 1 - first)] = int(0, 1) ? 127 : -127;
  return p;
}

// family A (the query's rounding e along the row): random rows
const rowsA = Array.from({ length: N }, () => Array.from({ length: DIM }, () => standardNormal(src)));
// family B (the row's rounding f along the query's ŷ): t = (127c, c φ), |φ| < 0.49, φ ∝ p
const C = 0.5;
const pB = Array.from({ length: N }, () => { const p = ints(1); p[0] = 0; return p; });
const rowsB = pB.map((p) => p.map((x, k) => (k === 0 ? 127 * C : (C * 0.49 * x) / 127)));
// family C (the kernel's float32 rounding): rows on their own int8 grid, t = b0 Q
const B0 = 2 ** -7;
const rowsC = Array.from({ length: N }, () => ints().map((q) => B0 * q));

const rows = [...rowsA, ...rowsB, ...rowsC];
const table = Float32Array.from(rows.flat());
const R = rows.length;
const norms = new Float64Array(R);
for (let j = 0; j < R; j++) for (let k = 0; k < DIM; k++) norms[j] += table[j * DIM + k] ** 2;
const row = (j) => table.subarray(j * DIM, (j + 1) * DIM);

/** A chunk whose scale is a (its first query is (127 a, 0, …)) followed by ``queries``. */
function chunk(a, queries) {
  const first = new Array(DIM).fill(0);
  first[0] = 127 * a;
  return Float64Array.from([first, ...queries].flat());
}

/** Checks the bound on every query of the chunk and every row; returns the worst measured error
 * over the bound among the rows ``[from, to)`` (the family the chunk is made for). */
async function worst(pass, y, from, to) {
  const m = y.length / DIM;
  const got = await pass.scoreBounds(y, m);
  assert.ok(got !== null);
  let ratio = 0;
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < R; j++) {
      let dot = 0;
      for (let k = 0; k < DIM; k++) dot += y[i * DIM + k] * table[j * DIM + k];
      const s = norms[j] - 2 * dot;
      const err = Math.abs(s - got.score[i * R + j]);
      const bound = got.bound[i * R + j];
      assert.ok(err <= bound + SLACK * (Math.abs(s) + bound),
        `query ${i}, row ${j}: error ${err} over the bound ${bound}`);
      if (j >= from && j < to && bound > 0) ratio = Math.max(ratio, err / bound);
    }
  }
  return ratio;
}

test("the int8 bound holds and is nearly reached, term by term, on adversarial data", async () => {
  const pass = await Int8CandidatePass.create(table, R, DIM, norms);
  assert.ok(pass !== null, "the integer kernel is exact here (nearest.test.mjs)");
  try {
    // A: y = λ t_j with every |y_k| < a/2: ŷ = 0, e = y ∥ t_j; the error 2 e·t_j = 2‖e‖‖t_j‖
    const a = 2 ** -3;
    const qa = rowsA.map((_, j) => {
      const t = row(j);
      const lam = (0.49 * a) / Math.max(...Array.from(t, Math.abs));
      return Array.from(t, (x) => lam * x);
    });
    const ratioA = await worst(pass, chunk(a, qa), 0, N);
    // B: y = a p exactly (e = 0), f_j ≈ c φ ∥ p: the error 2 ŷ·f_j ≈ 2‖ŷ‖‖f_j‖
    const ratioB = await worst(pass, chunk(a, pB.map((p) => p.map((x) => a * x))), N, 2 * N);
    // C: rows on their grid (f ≈ 2^-20 t) and short queries (e = 0): what is left is the float32
    // rounding of the kernel's output, |o| ≈ ‖t‖², against γ4 |β|. The kernel rounds to nearest,
    // about one ulp in all, where the proof allows four roundings of a full ulp (γ4): this family
    // catches a bound without its γ term, not a γ4 shrunk to γ2.
    const ac = 2 ** -15;
    const ratioC = await worst(pass, chunk(ac, Array.from({ length: 40 }, () => ints().map((x) => ac * x))), 2 * N, 3 * N);
    console.log(`# worst measured error / bound: A (query rounding) ${ratioA.toFixed(6)}, `
      + `B (table rounding) ${ratioB.toFixed(6)}, C (float32 rounding) ${ratioC.toFixed(4)}`);
    assert.ok(ratioA > 0.999, `A: ${ratioA}`);
    assert.ok(ratioB > 0.99, `B: ${ratioB}`);
    assert.ok(ratioC > 0.1, `C: ${ratioC}`);
  } finally {
    await pass.release();
  }
});
