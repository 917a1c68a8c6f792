/**
 * The samplers of the dχ mechanisms (Qu et al. 2021 §3.2.3, Eq. 3, after Feyisetan et al.
 * 2020): noise N = r·u with radius r ~ Gamma(n, 1/η) and u uniform on the unit sphere of R^n.
 * Its density is proportional to exp(-η‖N‖), which is what gives η·d(x, x')-privacy for the
 * Euclidean distance d.
 *
 * - standard normal: the ziggurat method (Marsaglia & Tsang 2000) with numpy's tables and tail
 *   handling, exactly as `random_standard_normal` in numpy;
 * - Gamma(α, 1), α > 1: Marsaglia & Tsang (2000, "A simple method for generating gamma
 *   variables"), the squeeze then the log test, as `random_standard_gamma` in numpy; α = 1 is
 *   the exponential (ziggurat), α < 1 Johnk-style rejection as numpy;
 * - direction: n standard normals divided by their norm (uniform on the sphere by the rotation
 *   invariance of the isotropic Gaussian).
 *
 * Every draw comes from a {@link BitSource}: OS entropy unless the caller passes a seeded one.
 * The draw order is numpy's (all radii, then the directions row by row), so a
 * {@link Pcg64Source} gives the Python edge's noise for the same seed.
 */

import { message } from "../format/messages.js";
import { BitSource, resolveSource } from "./random.js";
import {
  FE_DOUBLE, FI_DOUBLE, KE_DOUBLE, KI_DOUBLE, WE_DOUBLE, WI_DOUBLE, ZIGGURAT_EXP_R,
  ZIGGURAT_NOR_INV_R, ZIGGURAT_NOR_R,
} from "./ziggurat_tables.js";

const TWO_POW_23 = 2 ** 23;

/** A standard normal draw (ziggurat, 256 layers). */
export function standardNormal(src: BitSource): number {
  for (;;) {
    src.next64();
    const lo = src.lo;
    const hi = src.hi;
    const idx = lo & 0xff;
    // r >>= 8; sign = r & 1; rabs = (r >> 1) & (2^52 - 1): bits 9..60 of the 64-bit word
    const rabs = (hi & 0x1fffffff) * TWO_POW_23 + (lo >>> 9);
    let x = rabs * WI_DOUBLE[idx]!;
    if ((lo >>> 8) & 1) x = -x;
    if (rabs < KI_DOUBLE[idx]!) return x;
    if (idx === 0) {
      for (;;) {
        const xx = -ZIGGURAT_NOR_INV_R * Math.log1p(-src.nextDouble());
        const yy = -Math.log1p(-src.nextDouble());
        if (yy + yy > xx * xx) {
          return (lo >>> 17) & 1 ? -(ZIGGURAT_NOR_R + xx) : ZIGGURAT_NOR_R + xx;
        }
      }
    }
    if ((FI_DOUBLE[idx - 1]! - FI_DOUBLE[idx]!) * src.nextDouble() + FI_DOUBLE[idx]!
        < Math.exp(-0.5 * x * x)) {
      return x;
    }
  }
}

/** A standard exponential draw (ziggurat, 256 layers). */
export function standardExponential(src: BitSource): number {
  for (;;) {
    src.next64();
    // ri = u64 >> 3; idx = ri & 0xff; ri >>= 8: bits 11..63 (53 bits)
    const idx = (src.lo >>> 3) & 0xff;
    const ri = src.hi * 2 ** 21 + (src.lo >>> 11);
    const x = ri * WE_DOUBLE[idx]!;
    if (ri < KE_DOUBLE[idx]!) return x;
    if (idx === 0) return ZIGGURAT_EXP_R - Math.log1p(-src.nextDouble());
    if ((FE_DOUBLE[idx - 1]! - FE_DOUBLE[idx]!) * src.nextDouble() + FE_DOUBLE[idx]!
        < Math.exp(-x)) {
      return x;
    }
  }
}

/** A Gamma(shape, 1) draw, shape > 0. */
export function standardGamma(src: BitSource, shape: number): number {
  if (!(shape > 0) || !Number.isFinite(shape)) {
    throw new RangeError(`shape must be a finite number > 0, got ${shape}`);
  }
  if (shape === 1) return standardExponential(src);
  if (shape < 1) {
    for (;;) {
      const u = src.nextDouble();
      const v = standardExponential(src);
      if (u <= 1 - shape) {
        const x = Math.pow(u, 1 / shape);
        if (x <= v) return x;
      } else {
        const y = -Math.log((1 - u) / shape);
        const x = Math.pow(1 - shape + shape * y, 1 / shape);
        if (x <= v + y) return x;
      }
    }
  }
  const b = shape - 1 / 3;
  const c = 1 / Math.sqrt(9 * b);
  for (;;) {
    let x: number;
    let v: number;
    do {
      x = standardNormal(src);
      v = 1 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const u = src.nextDouble();
    if (u < 1 - 0.0331 * (x * x) * (x * x)) return b * v;
    if (Math.log(u) < 0.5 * x * x + b * (1 - v + Math.log(v))) return b * v;
  }
}

/** A uniform integer in [0, max] (max < 2^32 - 1) by Lemire's method on 32-bit draws, as
 * numpy's `random_bounded_uint64(..., use_masked=False)` for such a range. */
export function boundedUint32(src: BitSource, max: number): number {
  if (max === 0) return 0;
  if (!(Number.isInteger(max) && max > 0 && max < 0xffffffff)) {
    throw new RangeError(`max must be an integer in [0, 2^32 - 1), got ${max}`);
  }
  const excl = max + 1;
  const draw = (): [number, number] => {
    const r = src.next32();
    // m = r · excl as a 64-bit product: (high 32 bits, low 32 bits)
    const rHi = r >>> 16;
    const rLo = r & 0xffff;
    const eHi = excl >>> 16;
    const eLo = excl & 0xffff;
    const ll = rLo * eLo;
    const mid = rHi * eLo + rLo * eHi; // < 2^33
    const hh = rHi * eHi;
    const low = ll + (mid % 65536) * 65536;
    const lowWord = low % 4294967296;
    const high = hh + Math.floor(mid / 65536) + Math.floor(low / 4294967296);
    return [high, lowWord];
  };
  let [high, leftover] = draw();
  if (leftover < excl) {
    const threshold = (0xffffffff - max) % excl;
    while (leftover < threshold) [high, leftover] = draw();
  }
  return high;
}

/** numpy's `Generator._shuffle_int`: positions n-1 down to `first` swapped with a uniform
 * earlier-or-same position. */
function shuffleInt(src: BitSource, data: Int32Array | number[], first: number): void {
  for (let i = data.length - 1; i >= first; i--) {
    const j = boundedUint32(src, i);
    const t = data[j]!;
    data[j] = data[i]!;
    data[i] = t;
  }
}

/** `Generator.choice(pop, size, replace=False)` of numpy, for pop < 2^31: `size` distinct
 * integers of [0, pop) in numpy's order. */
export function choiceWithoutReplacement(src: BitSource, pop: number, size: number): Int32Array {
  if (size > pop || size < 0) throw new RangeError("size must be in [0, pop]");
  if (pop > 10000 && size > Math.floor(pop / 50)) {
    const idx = new Int32Array(pop);
    for (let i = 0; i < pop; i++) idx[i] = i;
    shuffleInt(src, idx, Math.max(pop - size, 1));
    return idx.slice(pop - size);
  }
  // Floyd's algorithm (numpy keeps the chosen set in an open-addressing hash; a Set is the same set)
  const out = new Int32Array(size);
  const chosen = new Set<number>();
  for (let j = pop - size; j < pop; j++) {
    const val = boundedUint32(src, j);
    const pick = chosen.has(val) ? j : val;
    chosen.add(pick);
    out[j - pop + size] = pick;
  }
  shuffleInt(src, out, 1);
  return out;
}

/** `Generator.permutation(n)` of numpy: a uniform permutation of [0, n). */
export function permutation(src: BitSource, n: number): Int32Array {
  const out = new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = i;
  // numpy's shuffle of a 1-d int64 array: _shuffle_raw with random_interval (masked rejection)
  for (let i = n - 1; i >= 1; i--) {
    const j = randomInterval(src, i);
    const t = out[j]!;
    out[j] = out[i]!;
    out[i] = t;
  }
  return out;
}

/** numpy's `random_interval(max)` for max < 2^32: masked rejection on 32-bit draws. */
function randomInterval(src: BitSource, max: number): number {
  if (max === 0) return 0;
  let mask = max;
  mask |= mask >>> 1;
  mask |= mask >>> 2;
  mask |= mask >>> 4;
  mask |= mask >>> 8;
  mask |= mask >>> 16;
  mask >>>= 0;
  for (;;) {
    const v = (src.next32() & mask) >>> 0;
    if (v <= max) return v;
  }
}

/** `count × dim` standard normals, row-major. */
export function standardNormals(src: BitSource, count: number): Float64Array {
  const out = new Float64Array(count);
  for (let i = 0; i < count; i++) out[i] = standardNormal(src);
  return out;
}

/** Check a positive finite parameter (one message format, as shared.mechanisms._checks). */
export function positive(name: string, value: number): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) {
    throw new RangeError(`${name} must be a finite number > 0, got ${String(value)}`);
  }
  return value;
}

/**
 * numpy's sum of ``n`` float64 values from ``lo`` (``pairwise_sum`` in numpy/_core/src/umath/
 * loops_utils.h.src, what ``np.add.reduce`` along a contiguous axis runs): under 8 values in
 * order; up to 128 in 8 interleaved partial sums added as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)),
 * then the rest in order; beyond, the two halves (split at a multiple of 8) recursively. The
 * same order gives the same rounding, so a noise direction matches numpy's to the bit.
 */
export function pairwiseSum(a: Float64Array, lo: number, n: number): number {
  if (n < 8) {
    let res = -0.0;
    for (let i = 0; i < n; i++) res += a[lo + i]!;
    return res;
  }
  if (n <= 128) {
    const r = a.slice(lo, lo + 8);
    let i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (let j = 0; j < 8; j++) r[j]! += a[lo + i + j]!;
    }
    let res = ((r[0]! + r[1]!) + (r[2]! + r[3]!)) + ((r[4]! + r[5]!) + (r[6]! + r[7]!));
    for (; i < n; i++) res += a[lo + i]!;
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return pairwiseSum(a, lo, n2) + pairwiseSum(a, lo + n2, n - n2);
}

/**
 * `count` dχ noise vectors in R^dim, row-major float64 (count × dim): radius ~ Gamma(dim, 1/eta),
 * direction uniform on the sphere. Draw order as `shared.mechanisms.dchi.sample_dchi_noise`.
 */
export function sampleDchiNoise(count: number, dim: number, eta: number,
                                source?: BitSource | null): Float64Array {
  if (!Number.isInteger(count) || count < 0) {
    throw new RangeError(`count must be an integer >= 0, got ${count}`);
  }
  if (!Number.isInteger(dim) || dim < 1) throw new RangeError(`dim must be an integer >= 1, got ${dim}`);
  positive("eta", eta);
  const scale = 1 / eta;
  if (!Number.isFinite(scale)) {
    throw new RangeError(message("DCHI_INVERSE_OVERFLOW", { eta }));
  }
  const src = resolveSource(source);
  const radius = new Float64Array(count);
  for (let i = 0; i < count; i++) radius[i] = scale * standardGamma(src, dim);
  const out = standardNormals(src, count * dim);
  const norms = new Float64Array(count);
  const squares = new Float64Array(dim);
  const computeNorm = (i: number): number => { // np.linalg.norm(axis=1): sqrt of add.reduce(x*x)
    for (let k = 0; k < dim; k++) squares[k] = out[i * dim + k]! * out[i * dim + k]!;
    return Math.sqrt(pairwiseSum(squares, 0, dim));
  };
  for (let i = 0; i < count; i++) norms[i] = computeNorm(i);
  // probability zero; never silently divide by 0 (numpy redraws every zero row at once)
  for (;;) {
    const zero: number[] = [];
    for (let i = 0; i < count; i++) if (norms[i] === 0) zero.push(i);
    if (zero.length === 0) break;
    for (const i of zero) {
      for (let k = 0; k < dim; k++) out[i * dim + k] = standardNormal(src);
    }
    for (const i of zero) norms[i] = computeNorm(i);
  }
  for (let i = 0; i < count; i++) {
    const n = norms[i]!;
    const r = radius[i]!;
    for (let k = i * dim; k < (i + 1) * dim; k++) out[k] = (out[k]! / n) * r;
  }
  return out;
}

