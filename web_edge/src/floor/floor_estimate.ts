/**
 * The analytic estimate of the dχ privacy floor (shared/floor.py's `DChiFloor`): where, in η,
 * the share of tokens that come back unchanged crosses the threshold. It decides nothing (the
 * floor measures the output directly: ./floor.ts); a refusal quotes it ("on this bundle it
 * starts near eta=…").
 *
 * Along a direction u the nearest-token cell of x (convex) is left at distance
 * s*(x, u) = min over t with u·(t−x) > 0 of ‖t−x‖² / (2 u·(t−x)), so
 * Pr[unchanged | x, u] = Pr[Gamma(n, 1) ≤ η s*], averaged over (token, direction) pairs drawn
 * from the caller's generator, in shared.floor's order (numpy's, reproduced by the samplers),
 * so a seeded generator gives both edges the same pairs; only float32 rounding of the products
 * differs.
 */

import { FLOOR } from "../generated/spec.js";
import type { ExactNearest } from "../search/nearest.js";
import type { BitSource } from "../random/random.js";
import { choiceWithoutReplacement, permutation, standardNormal } from "../random/samplers.js";

/** distinct directions among the pairs on a large table (shared.floor.DIRECTIONS) */
export const DIRECTIONS: number = FLOOR.DIRECTIONS;
/** table values × pairs above which the pairs share DIRECTIONS directions */
const SHARED_DIRECTIONS_ABOVE: number = FLOOR.SHARED_DIRECTIONS_ABOVE;

/** Pr[Gamma(n, 1) ≤ z] for an integer shape n ≥ 1: 1 − Pr[Poisson(z) ≤ n − 1] (log-sum-exp). */
export function gammaCdf(n: number, z: number): number {
  if (!(z > 0)) return 0;
  if (!Number.isFinite(z)) return 1;
  const logZ = Math.log(z);
  let top = -Infinity;
  const terms = new Float64Array(n);
  let logFact = 0;
  for (let k = 0; k < n; k++) {
    if (k > 0) logFact += Math.log(k);
    terms[k] = k * logZ - z - logFact;
    if (terms[k]! > top) top = terms[k]!;
  }
  let sum = 0;
  for (let k = 0; k < n; k++) sum += Math.exp(terms[k]! - top);
  const logQ = top + Math.log(sum);
  return -Math.expm1(Math.min(logQ, 0));
}

/** Exit distances s*(x, u) of the floor's (token, direction) pairs on a regular table. */
export class DChiFloor {
  constructor(readonly dim: number, readonly exit: Float64Array, readonly tMax: number) {}

  /**
   * The exit distances of ``tokens`` pairs drawn from ``source``, from the search's float32
   * products (``index`` is the exact search over the same regular table, rows × dim).
   */
  static async compute(table: Float32Array, rows: number, dim: number, index: ExactNearest,
                       tokens: number, source: BitSource, chunk = 256): Promise<DChiFloor> {
    const { picked, ndir } = floorPairs(source, rows, table.length, tokens);
    const u = drawDirections(source, ndir, dim);
    // identical rows: the exact search returns the lowest one, the others never
    const same = twinGroups(table, rows, dim, picked);
    const norms = new Float64Array(rows);
    let maxN = 0;
    for (let v = 0; v < rows; v++) {
      let s = 0;
      for (let k = 0; k < dim; k++) s += table[v * dim + k]! ** 2;
      norms[v] = Math.fround(s);
      if (s > maxN) maxN = s;
    }
    // u·t for every direction and row: the product gives −2 u·t
    const ut = new Float32Array(ndir * rows);
    for (let s0 = 0; s0 < ndir; s0 += chunk) {
      const k = Math.min(chunk, ndir - s0);
      const p = await index.scores(u.subarray(s0 * dim, (s0 + k) * dim), k, false);
      for (let i = 0; i < p.length; i++) ut[s0 * rows + i] = -0.5 * p[i]!;
    }
    const exit = new Float64Array(picked.length);
    for (let s0 = 0; s0 < picked.length; s0 += chunk) {
      const c = Math.min(chunk, picked.length - s0);
      const x = new Float64Array(c * dim);
      for (let i = 0; i < c; i++) {
        x.set(table.subarray(picked[s0 + i]! * dim, (picked[s0 + i]! + 1) * dim), i * dim);
      }
      const d = await index.scores(x, c); // ‖t‖² − 2 x·t
      for (let i = 0; i < c; i++) {
        const r = picked[s0 + i]!;
        const w = (s0 + i) % ndir;
        let ux = 0;
        for (let k = 0; k < dim; k++) ux += u[w * dim + k]! * x[i * dim + k]!;
        ux = Math.fround(ux);
        const group = same.get(r);
        const skip = group ? new Set<number>(group) : null;
        let best = -Infinity; // max over rows of a/d, NaN skipped (numpy's fmax)
        let any = false;
        for (let v = 0; v < rows; v++) {
          if (v === r || (skip !== null && skip.has(v))) continue;
          const dd = Math.max(Math.fround(d[i * rows + v]! + norms[r]!), 0);
          const a = Math.fround(ut[w * rows + v]! - ux);
          const q = a / dd;
          if (Number.isNaN(q)) continue;
          any = true;
          if (q > best) best = q;
        }
        let ex = any && best > 0 ? 0.5 / best : Infinity;
        if (group && group[0]! < r) ex = 0; // a duplicate with a lower row wins every tie
        exit[s0 + i] = ex;
      }
    }
    return new DChiFloor(dim, exit, Math.sqrt(maxN));
  }

  /** Estimated Pr[the nearest regular token of φ(x) + N is x] at ``eta``. */
  unchanged(eta: number): number {
    let s = 0;
    for (const e of this.exit) s += gammaCdf(this.dim, eta * e);
    return s / this.exit.length;
  }

  /** The smallest η (to ``rtol``) at which {@link unchanged} exceeds ``threshold``; Infinity if
   * none does, 0 if every η does. */
  floorEta(threshold: number, rtol: number = FLOOR.ESTIMATE_RTOL): number {
    const n = this.exit.length;
    const pos = Array.from(this.exit).filter((e) => e > 0);
    if (pos.length / n <= threshold) return Infinity;
    if (Array.from(this.exit).filter((e) => e === Infinity).length / n > threshold) return 0;
    const finite = pos.filter(Number.isFinite).sort((a, b) => a - b);
    const m = finite.length;
    const median = m % 2 ? finite[(m - 1) / 2]! : (finite[m / 2 - 1]! + finite[m / 2]!) / 2;
    let lo = this.dim / median;
    let hi = lo;
    while (this.unchanged(hi) <= threshold) {
      lo = hi;
      hi *= 2;
    }
    while (lo > 1e-300 && this.unchanged(lo) > threshold) {
      hi = lo;
      lo /= 2;
    }
    while (hi / lo > 1 + rtol) {
      const mid = Math.sqrt(lo * hi);
      if (this.unchanged(mid) > threshold) hi = mid;
      else lo = mid;
    }
    return hi;
  }
}

/** The floor's pairs as shared.floor draws them from ``rng``: the token of each pair (rows of
 * the regular table) and how many distinct directions there are (drawn next). */
function floorPairs(rng: BitSource, rows: number, size: number, tokens: number
): { picked: Int32Array; ndir: number } {
  let picked: Int32Array;
  if (tokens >= rows) {
    const p = permutation(rng, rows);
    picked = Int32Array.from({ length: tokens }, (_, i) => p[i % rows]!); // np.resize
  } else {
    picked = choiceWithoutReplacement(rng, rows, tokens);
  }
  const ndir = size * picked.length <= SHARED_DIRECTIONS_ABOVE ? picked.length : Math.min(picked.length, DIRECTIONS);
  return { picked, ndir };
}

/** The next ``count`` directions of ``rng``: standard normals, row by row, each row divided by
 * its norm and rounded to float32 (shared.floor's order and rounding). */
function drawDirections(rng: BitSource, count: number, dim: number): Float64Array {
  const u = new Float64Array(count * dim);
  for (let i = 0; i < u.length; i++) u[i] = standardNormal(rng);
  for (let j = 0; j < count; j++) {
    let s = 0;
    for (let k = 0; k < dim; k++) s += u[j * dim + k]! ** 2;
    const n = Math.sqrt(s);
    for (let k = 0; k < dim; k++) u[j * dim + k] = Math.fround(u[j * dim + k]! / n);
  }
  return u;
}

/** The rows of ``picked`` equal to another row: row -> every row equal to it (ascending; as
 * shared.floor, which compares their bytes). Each row is first matched to the picked rows by
 * a hash of its first two coordinates' bits, then compared in full. */
function twinGroups(table: Float32Array, rows: number, dim: number, picked: Int32Array): Map<number, number[]> {
  const bits = new Uint32Array(table.buffer, table.byteOffset, table.length);
  const second = dim > 1 ? 1 : 0;
  const key = (v: number): number => (bits[v * dim]! ^ Math.imul(bits[v * dim + second]!, 0x9e3779b1)) | 0;
  const wanted = new Map<number, number[]>(); // key -> distinct picked rows with it
  for (const r of new Set(picked)) {
    const k = key(r);
    const list = wanted.get(k);
    if (list === undefined) wanted.set(k, [r]);
    else list.push(r);
  }
  const equal = (a: number, b: number): boolean => {
    for (let k = 0; k < dim; k++) if (bits[a * dim + k] !== bits[b * dim + k]) return false;
    return true;
  };
  const found = new Map<number, number[]>(); // picked row -> every row equal to it
  for (let v = 0; v < rows; v++) {
    const list = wanted.get(key(v));
    if (list === undefined) continue;
    for (const r of list) {
      if (!equal(r, v)) continue;
      const g = found.get(r);
      if (g === undefined) found.set(r, [v]);
      else g.push(v);
    }
  }
  const same = new Map<number, number[]>();
  for (const [r, g] of found) if (g.length > 1) same.set(r, g);
  return same;
}

