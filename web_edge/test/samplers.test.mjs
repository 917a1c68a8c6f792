// The dχ samplers: the radius is Gamma(n, 1/η), the direction uniform on the sphere, and a
// seeded source reproduces numpy's draws. Significance level 1e-3 for seeded draws (a correct
// sampler passes deterministically; the wrong samplers below are rejected with p < 1e-12), and
// 1e-6 for draws from OS entropy (a false alarm once in a million runs).
import assert from "node:assert/strict";
import { test } from "node:test";

import { CryptoSource } from "../dist/random/random.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { sampleDchiNoise, standardGamma, standardNormal } from "../dist/random/samplers.js";
import { betaI, gammaP, ksPvalue } from "./stats.mjs";

const ALPHA = 1e-3;
const ALPHA_OS = 1e-6;

function norms(noise, dim) {
  const out = new Float64Array(noise.length / dim);
  for (let i = 0; i < out.length; i++) {
    let s = 0;
    for (let k = 0; k < dim; k++) s += noise[i * dim + k] ** 2;
    out[i] = Math.sqrt(s);
  }
  return out;
}

function radiusPvalue(noise, dim, eta) {
  return ksPvalue(norms(noise, dim), (r) => gammaP(dim, r * eta));
}

/** KS tests of u·a for fixed unit axes a: (u·a + 1)/2 ~ Beta((n-1)/2, (n-1)/2) if u is uniform;
 * three random axes and the first coordinate axis. */
function directionPvalues(noise, dim) {
  const r = norms(noise, dim);
  const src = new Pcg64Source(1);
  const axes = [];
  for (let j = 0; j < 3; j++) {
    const a = Array.from({ length: dim }, () => standardNormal(src));
    const n = Math.hypot(...a);
    axes.push(a.map((x) => x / n));
  }
  axes.push(Array.from({ length: dim }, (_, k) => (k === 0 ? 1 : 0)));
  const h = (dim - 1) / 2;
  return axes.map((a) => {
    const xs = new Float64Array(r.length);
    for (let i = 0; i < r.length; i++) {
      let dot = 0;
      for (let k = 0; k < dim; k++) dot += noise[i * dim + k] * a[k];
      xs[i] = (dot / r[i] + 1) / 2;
    }
    return ksPvalue(xs, (x) => betaI(h, h, x));
  });
}

for (const [dim, eta, count] of [[2, 1.0, 20000], [16, 10.0, 20000], [384, 65.0, 5000]]) {
  test(`radius is Gamma(${dim}, 1/${eta}) and the direction uniform (seeded, ${count} draws)`, () => {
    const noise = sampleDchiNoise(count, dim, eta, new Pcg64Source(dim));
    assert.equal(noise.length, count * dim);
    assert.ok(radiusPvalue(noise, dim, eta) > ALPHA);
    assert.ok(Math.min(...directionPvalues(noise, dim)) > ALPHA);
    // mean norm n/eta (Qu et al. §5.2): the sd of the mean is sqrt(n)/eta/sqrt(count), under 0.4%
    const mean = norms(noise, dim).reduce((a, b) => a + b) / count;
    assert.ok(Math.abs(mean / (dim / eta) - 1) < 0.01, `mean norm ${mean} vs n/eta ${dim / eta}`);
  });
}

test("the default source (OS entropy) passes the same tests", () => {
  const noise = sampleDchiNoise(5000, 384, 65.0);
  assert.ok(radiusPvalue(noise, 384, 65.0) > ALPHA_OS);
  assert.ok(Math.min(...directionPvalues(noise, 384)) > ALPHA_OS);
  const small = sampleDchiNoise(20000, 2, 1.0, new CryptoSource());
  assert.ok(radiusPvalue(small, 2, 1.0) > ALPHA_OS);
  assert.ok(Math.min(...directionPvalues(small, 2)) > ALPHA_OS);
});

test("the radius test rejects per-coordinate noise (Laplace, and Gaussian of the right mean norm)", () => {
  const src = new Pcg64Source(0);
  const dim = 384, eta = 65, count = 5000;
  const laplace = new Float64Array(count * dim);
  for (let i = 0; i < laplace.length; i++) {
    const u = src.nextDouble() - 0.5;
    laplace[i] = -Math.sign(u) * Math.log(1 - 2 * Math.abs(u)) / eta;
  }
  assert.ok(radiusPvalue(laplace, dim, eta) < 1e-12);
  const gauss = new Float64Array(count * dim);
  for (let i = 0; i < gauss.length; i++) gauss[i] = standardNormal(src) * (dim / eta) / Math.sqrt(dim);
  assert.ok(radiusPvalue(gauss, dim, eta) < 1e-12);
});

test("the direction test rejects a skewed direction (half the sphere folded)", () => {
  const noise = sampleDchiNoise(20000, 16, 10.0, new Pcg64Source(0));
  for (let i = 0; i < 20000; i++) noise[i * 16] = Math.abs(noise[i * 16]);
  assert.ok(Math.min(...directionPvalues(noise, 16)) < 1e-12);
});

test("the radius test rejects a radius of the wrong shape (Gamma(n-1, 1/eta), Gamma(n+1, 1/eta))", () => {
  const src = new Pcg64Source(3);
  for (const wrong of [383, 385]) {
    const radii = Array.from({ length: 20000 }, () => standardGamma(src, wrong) / 65);
    assert.ok(ksPvalue(radii, (r) => gammaP(384, r * 65)) < 1e-6);
  }
  const right = Array.from({ length: 20000 }, () => standardGamma(src, 384) / 65);
  assert.ok(ksPvalue(right, (r) => gammaP(384, r * 65)) > ALPHA);
});

test("a seeded source reproduces; the default draws fresh entropy", () => {
  const a = sampleDchiNoise(4, 8, 5.0, new Pcg64Source(7));
  const b = sampleDchiNoise(4, 8, 5.0, new Pcg64Source(7));
  assert.deepEqual(a, b);
  assert.notDeepEqual(sampleDchiNoise(4, 8, 5.0), sampleDchiNoise(4, 8, 5.0));
});

test("numpy.random.default_rng(42) draws, bit for bit", () => {
  // printed by: python -c "import numpy as np; r = np.random.default_rng(42);
  //   print(r.gamma(384, 1/65, 3).tolist(), r.standard_normal(3).tolist())"
  const src = new Pcg64Source(42);
  const g = [0, 1, 2].map(() => (1 / 65) * standardGamma(src, 384));
  assert.deepEqual(g, [5.994865994699342, 6.131609037371509, 5.333934491967966]);
  assert.deepEqual([0, 1, 2].map(() => standardNormal(src)),
    [0.12784040316728537, -0.3162425923435822, -0.016801157504288795]);
});

test("bad parameters are refused with one message", () => {
  assert.throws(() => sampleDchiNoise(1, 8, 0), /eta must be a finite number > 0, got 0/);
  assert.throws(() => sampleDchiNoise(1, 8, Number.NaN), /eta must be a finite number > 0/);
  assert.throws(() => sampleDchiNoise(1, 8, 5e-324), /too small to compute/);
  assert.throws(() => sampleDchiNoise(-1, 8, 1), /count must be an integer >= 0/);
});
