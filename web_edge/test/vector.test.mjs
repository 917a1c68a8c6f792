// The sentence-vector mechanisms' samplers and bit encoding: Laplace draws by a KS test (and a
// wrong scale rejected), OME's randomized response at its flip probabilities, numpy's packbits
// order, and the worst-case ε over the bits.
import assert from "node:assert/strict";
import { test } from "node:test";

import { Pcg64Source } from "../dist/random/pcg64.js";
import { CryptoSource } from "../dist/random/random.js";
import { Laplace, laplaceDraw } from "../dist/mechanisms/laplace.js";
import { OME, bitFlipEpsilon, packBits } from "../dist/mechanisms/ome.js";
import { ksPvalue } from "./stats.mjs";

const laplaceCdf = (b) => (x) => (x < 0 ? 0.5 * Math.exp(x / b) : 1 - 0.5 * Math.exp(-x / b));

test("Laplace draws pass a KS test at 1e-3 (seeded) and 1e-6 (OS entropy); a wrong scale fails", () => {
  const src = new Pcg64Source(8);
  const xs = Array.from({ length: 20000 }, () => laplaceDraw(src, 2.5));
  assert.ok(ksPvalue(xs, laplaceCdf(2.5)) > 1e-3);
  assert.ok(ksPvalue(xs, laplaceCdf(2.0)) < 1e-6); // a scale 20% off
  const os = new CryptoSource();
  assert.ok(ksPvalue(Array.from({ length: 20000 }, () => laplaceDraw(os, 0.1)), laplaceCdf(0.1)) > 1e-6);
  // numpy: python -c "import numpy as np; print(np.random.default_rng(3).laplace(0, 2.0, 3).tolist())"
  const s3 = new Pcg64Source(3);
  assert.deepEqual([0, 1, 2].map(() => laplaceDraw(s3, 2)), [-3.528697195300039, -1.4946956546505046, 1.8453668956854112]);
});

test("Laplace min-max scales each vector, then adds noise of scale r/eps (vector) or 1/eps", () => {
  const m = new Laplace(4, "vector");
  assert.equal(m.scale(16), 4);
  assert.equal(new Laplace(4, "coordinate").scale(16), 0.25);
  assert.equal(new Laplace(4, "coordinate").vectorEpsilon(16), 64);
  const noiseless = new Laplace(1e300, "coordinate"); // scale 1e-300: no visible noise
  const out = noiseless.privatize(Float32Array.of(2, 4, 6, 4, 4, 4), 3, new Pcg64Source(0));
  const want = [0, 0.5, 1, 0, 0, 0]; // a constant row becomes zeros
  out.forEach((x, i) => assert.ok(Math.abs(x - want[i]) < 1e-250, `${i}: ${x}`));
  assert.throws(() => new Laplace(1, "vector", 1), /word_dropout must be in \[0, 1\)/);
});

test("OME flips each bit at its probability (binomial tolerance 5 sd)", () => {
  const m = new OME(50, 3, 8);
  const [p, q] = m.bitProbabilities();
  const n = 4000;
  const ones = new Uint8Array(m.nBits * n).fill(1);
  const zeros = new Uint8Array(m.nBits * n);
  const a = m.perturb(ones, new Pcg64Source(1));
  const b = m.perturb(zeros, new Pcg64Source(2));
  for (const parity of [0, 1]) {
    let k = 0, tot = 0;
    for (let i = parity; i < a.length; i += 2) { k += a[i]; tot++; }
    const want = p[parity];
    assert.ok(Math.abs(k / tot - want) < 5 * Math.sqrt(want * (1 - want) / tot), `p parity ${parity}`);
  }
  const rate = b.reduce((s, x) => s + x, 0) / b.length;
  assert.ok(Math.abs(rate - q) < 5 * Math.sqrt(q * (1 - q) / b.length));
});

test("OME encodes sign + 4 integer + 5 fraction bits of the z-score, and packs as numpy", () => {
  const m = new OME(1, 1, 2);
  // z-scores of [0, 2] are [-1, 1]: sign 1, magnitude 1.0 -> 0001.00000
  assert.deepEqual(Array.from(m.encode(Float32Array.of(0, 2))), [1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
  // python -c "import numpy as np; print(list(np.packbits([1,0,1,1,0,0,0,0,0,1])))"  -> [176, 64]
  assert.deepEqual(Array.from(packBits(Uint8Array.of(1, 0, 1, 1, 0, 0, 0, 0, 0, 1))), [176, 64]);
  // worst case summed over the bits (shared.accounting.bit_flip_epsilon); rounding to 0/1: inf
  const [p, q] = new OME(500, 30, 16).bitProbabilities();
  // edge-agent privatize --mechanism ome --epsilon 500 --lam 30 (r = 16) prints "holds eps=813.7"
  assert.ok(Math.abs(bitFlipEpsilon(p, q) - 813.7) < 0.05);
  assert.equal(bitFlipEpsilon(Float64Array.of(1), 0.5), Infinity);
});
