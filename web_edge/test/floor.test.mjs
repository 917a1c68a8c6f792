// The dχ privacy floor (shared/floor.py's rule, issue 34): degenerate tables refused, the
// output measured directly with a sequential Wilson test, a refusal worded as the Python
// edge's; the hostile tables of issue 34 (scaled x1000, copied rows, near-copies) refused with
// OS entropy at every check; the near-duplicate count equal to a float64 brute force on both
// of its paths; the search's nearest-other-row answers and bounds exact for small k.
import assert from "node:assert/strict";
import { test } from "node:test";

import { EdgeBundle } from "../dist/bundle/bundle.js";
import { DChiText } from "../dist/mechanisms/dchi.js";
import { WeakPrivacyError } from "../dist/errors.js";
import {
  MEASURE_BATCH, MEASURE_FIRST, MEASURE_MAX, THRESHOLD, dchiWeakReason, measureUnchanged, pct, tableProblem, wilsonInterval,
} from "../dist/floor/floor.js";
import { ExactNearest } from "../dist/search/nearest.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { Privatizer } from "../dist/mechanisms/privatizer.js";
import { choiceWithoutReplacement } from "../dist/random/samplers.js";
import { bundleFiles, gaussianTable, quantizeInt8, reader, vocabulary } from "./bundles.mjs";

const REFUSAL = /^dchi-text eta=[\d.e+-]+ is weaker than the privacy floor: (100|\d{1,2}\.\d\d)% of [\d,]+ tokens drawn at random came back unchanged \(floor 97\.00%; on this bundle it starts near eta=[\d.e+-]+\)$/;

async function bundleOf(values, rows, dim, kind = "embeddings") {
  const vocab = vocabulary(rows);
  const opts = kind === "int8" ? { ...quantizeInt8(values, rows, dim), kind, dim: 384 } : kind === "float32"
    ? { values, kind, dim: 384 } : { values, dim };
  return EdgeBundle.fromFiles(reader(bundleFiles({ vocab, ...opts })), "test");
}

/** The regular rows scaled (x1000: the noise no longer moves a token) or copied, as the
 * hostile server of issue 34 built them. */
function hostile(values, rows, dim, { scale = 1000, copies = 0, jitter = 0 } = {}) {
  const t = Float32Array.from(values);
  for (let i = 8; i < rows; i++) for (let k = 0; k < dim; k++) t[i * dim + k] *= scale;
  const rng = new Pcg64Source(9);
  for (let c = 0; c < copies; c++) {
    const i = 8 + c * 2;
    for (let k = 0; k < dim; k++) t[i * dim + k] = t[(i + 1) * dim + k] + jitter * (rng.nextDouble() - 0.5);
  }
  return t;
}

test("the Wilson interval is shared.floor's, to the last bit", () => {
  const want = [[0, 128, 0.0, 0.16339869281045752], [128, 128, 0.8366013071895424, 1.0],
    [42, 128, 0.16434610186572912, 0.5480721987878656], [1990, 2048, 0.9469066927410525, 0.9850759411229126],
    [896, 896, 0.9728555917480998, 0.9999999999999999], [868, 896, 0.9246628121381886, 0.987389305125655],
    [5, 7, 0.1139025727394905, 0.9798474272605096]];
  for (const [k, n, lo, hi] of want) assert.deepEqual(wilsonInterval(k, n), [lo, hi], `${k}/${n}`);
  assert.deepEqual(wilsonInterval(0, 0), [0, 1]);
  assert.equal(THRESHOLD, 0.97);
});

test("shares print as shared.floor._pct prints them: exact ties to the even digit", () => {
  // Python's outputs (f"{100 * p:.2f}%"), where JS's toFixed would round the tie up
  for (const [k, n, want] of [[4, 128, "3.12%"], [12, 128, "9.38%"], [20, 128, "15.62%"], [36, 128, "28.12%"],
    [1984, 2048, "96.88%"], [1728, 2048, "84.38%"]]) assert.equal(pct(k / n), want, `${k}/${n}`);
  assert.equal(pct(0.97), "97.00%");
  assert.equal(pct(1990 / 2048), "97.17%");
  assert.equal(pct(1), "100%");
});

test("an honest table passes at a low eta in one step and is refused far past its floor", async () => {
  const rows = 600;
  const b = await bundleOf(gaussianTable(rows, 16, 1), rows, 16);
  const low = await DChiText.create(b, 2);
  try {
    const [same, drawn] = await measureUnchanged(low);
    assert.equal(drawn, MEASURE_FIRST); // far from the line: the first step decides
    assert.ok(same / drawn < 0.5, `${same}/${drawn}`);
    assert.equal(await dchiWeakReason("dchi-text", 2, b, low), null);
  } finally {
    await low.release();
  }
  const high = await DChiText.create(b, 1e4);
  try {
    const why = await dchiWeakReason("dchi-text", 1e4, b, high);
    assert.match(why, REFUSAL);
    assert.match(why, /: 100% of 896 tokens/); // all unchanged: the Wilson bound clears 0.97 at 896
    // a seeded generator gives the same message twice (the Python edge's, for that seed)
    const a = await dchiWeakReason("dchi-text", 1e4, b, high, { source: new Pcg64Source(3) });
    assert.equal(await dchiWeakReason("dchi-text", 1e4, b, high, { source: new Pcg64Source(3) }), a);
    await assert.rejects(Privatizer.create(b, { mechanism: "dchi-text", eta: 1e4 }),
      (e) => e instanceof WeakPrivacyError && REFUSAL.test(e.message));
    const weak = await Privatizer.create(b, { mechanism: "dchi-text", eta: 1e4, allowWeakPrivacy: true });
    assert.match(weak.weakPrivacy, REFUSAL);
    await weak.release();
  } finally {
    await high.release();
  }
});

test("near the line the measurement runs to 2,048 tokens and the share decides", async () => {
  const rows = 600;
  const b = await bundleOf(gaussianTable(rows, 16, 5), rows, 16);
  // find an eta whose unchanged share sits near 0.97 (bisection on seeded measurements)
  let lo = 1;
  let hi = 1e4;
  for (let i = 0; i < 24; i++) {
    const mid = Math.sqrt(lo * hi);
    const t = await DChiText.create(b, mid);
    const [s, n] = await measureUnchanged(t, new Pcg64Source(i));
    await t.release();
    if (s / n > THRESHOLD) hi = mid;
    else lo = mid;
  }
  const t = await DChiText.create(b, hi);
  try {
    const runs = [];
    for (let i = 0; i < 6; i++) runs.push(await measureUnchanged(t, new Pcg64Source(100 + i)));
    assert.ok(runs.some(([, n]) => n === MEASURE_MAX), JSON.stringify(runs)); // undecided until the end
    for (const [s, n] of runs) {
      // steps of 32, 32, 64, then 128 each: 32, 64, 128, 256, 384, ... drawn
      assert.ok((n === MEASURE_FIRST || n === 2 * MEASURE_FIRST || n % MEASURE_BATCH === 0) && n <= MEASURE_MAX);
      const [wlo, whi] = wilsonInterval(s, n);
      assert.ok(n === MEASURE_MAX || whi <= THRESHOLD || wlo > THRESHOLD);
    }
  } finally {
    await t.release();
  }
});

test("the hostile tables of issue 34 are refused, with OS entropy at every check", async () => {
  const rows = 600;
  const dim = 16;
  const honest = gaussianTable(rows, dim, 7);
  const eta = 3;
  const good = await bundleOf(honest, rows, dim);
  const g = await DChiText.create(good, eta);
  assert.equal(await dchiWeakReason("dchi-text", eta, good, g), null);
  await g.release();
  const cases = [
    [{ copies: 0 }, REFUSAL],
    [{ copies: 40 }, /the bundle's table is degenerate: 80 of its 592 regular tokens share 40 rows \(identical rows: the search can never return some of them\)$/],
    [{ copies: 40, jitter: 1e-3 }, /the bundle's table is degenerate: \d+ of 256 regular rows drawn at random lie within 0\.001 x the median nearest-row distance of another row \(near-duplicate rows\)$/],
  ];
  for (const [how, why] of cases) {
    const b = await bundleOf(hostile(honest, rows, dim, how), rows, dim);
    for (let i = 0; i < 3; i++) { // fresh draws each time: no fixed rows a table could be fitted to
      await assert.rejects(Privatizer.create(b, { mechanism: "dchi-text", eta }),
        (e) => e instanceof WeakPrivacyError && why.test(e.message), JSON.stringify(how));
    }
    await assert.rejects(Privatizer.create(b, { mechanism: "dchi-embedding", eta }),
      (e) => e instanceof WeakPrivacyError && e.message.startsWith("dchi-embedding eta=3 is weaker than the privacy floor: "));
  }
});

/** shared.floor._near_duplicates in float64 (norms + norms - 2 dot, as numpy computes it). */
function bruteNearDuplicates(table, reg, dim, picked) {
  const norms = Float64Array.from({ length: reg }, (_, v) => {
    let s = 0;
    for (let k = 0; k < dim; k++) s += table[v * dim + k] ** 2;
    return s;
  });
  const nearest = Float64Array.from(picked, (p) => {
    let best = Infinity;
    for (let v = 0; v < reg; v++) {
      if (v === p) continue;
      let dot = 0;
      for (let k = 0; k < dim; k++) dot += table[p * dim + k] * table[v * dim + k];
      best = Math.min(best, norms[p] + norms[v] - 2 * dot);
    }
    return Math.sqrt(Math.max(best, 0));
  });
  const s = Float64Array.from(nearest).sort();
  const med = (s[127] + s[128]) / 2;
  return med > 0 ? nearest.filter((d) => d < 1e-3 * med).length : 0;
}

test("the near-duplicate count is the float64 brute force's, on the fast path and the exact one", async () => {
  for (const [rows, dim, kind] of [[5000, 16, "embeddings"], [4200, 32, "float32"]]) {
    const base = gaussianTable(rows, dim, 11);
    for (const planted of [0, 300, 600]) { // up to 29% of the rows: the median stays an honest row's
      const t = Float32Array.from(base);
      // planted pairs: half well inside 1e-3 x the median nearest distance, half well outside
      const rng = new Pcg64Source(planted);
      for (let c = 0; c < planted; c++) {
        const i = 8 + 2 * c;
        const step = c % 2 ? 3e-3 : 2e-4;
        for (let k = 0; k < dim; k++) t[i * dim + k] = t[(i + 1) * dim + k] + (k === c % dim ? step : 0) * (rng.nextDouble() < 0.5 ? 1 : -1);
      }
      const b = await bundleOf(t, rows, dim, kind);
      const text = await DChiText.create(b, 1);
      let found = 0;
      try {
        for (const seed of [1, 2]) {
          const why = await tableProblem(b, text.index, new Pcg64Source(seed));
          const picked = choiceWithoutReplacement(new Pcg64Source(seed), b.regularIds.length, 256);
          const close = bruteNearDuplicates(b.regularTable, b.regularIds.length, dim, picked);
          const got = why === null ? 0 : Number(/(\d+) of 256 regular rows/.exec(why)?.[1]);
          assert.equal(got, close, `${kind} ${dim}-d, ${planted} planted, seed ${seed}: ${why}`);
          if (planted === 0) assert.equal(why, null);
          found += got;
        }
        if (planted > 0) assert.ok(found > 0, `${kind}: no planted pair was drawn`);
      } finally {
        await text.release();
      }
    }
  }
});

test("nearest other row and its bounds are exact on every backend, for k = 32 and 64 int8 tables", async () => {
  for (const dim of [32, 64]) {
    const rows = 4400; // the int8 pass from 4,096 rows
    const raw = gaussianTable(rows, dim, dim);
    const { q, scale } = quantizeInt8(raw, rows, dim);
    const table = Float32Array.from(q, (x, i) => Math.fround(x * scale[i % dim]));
    const which = choiceWithoutReplacement(new Pcg64Source(dim), rows, 200);
    const brute = Float64Array.from(which, (r) => {
      let best = Infinity;
      for (let v = 0; v < rows; v++) {
        if (v === r) continue;
        let d = 0;
        for (let k = 0; k < dim; k++) d += (table[r * dim + k] - table[v * dim + k]) ** 2;
        best = Math.min(best, d);
      }
      return best;
    });
    for (const backend of ["int8", "ort", "loop"]) {
      const index = await ExactNearest.create(table, rows, dim, null, { backend });
      try {
        const { rows: got, dist2 } = await index.nearestOther(which);
        which.forEach((r, i) => {
          assert.notEqual(got[i], r);
          assert.equal(dist2[i], brute[i], `${backend} ${dim}-d row ${r}`);
        });
        const { lo, hi } = await index.nearestOtherBounds(which);
        which.forEach((r, i) => assert.ok(lo[i] <= brute[i] && brute[i] <= hi[i], `${backend} ${dim}-d bounds of row ${r}`));
      } finally {
        await index.release();
      }
    }
  }
});
