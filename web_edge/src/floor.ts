/**
 * The privacy floor of shared/floor.py for dχ-privacy: parameters that leave the output
 * (nearly) the raw input are refused, with the same message as the Python edge.
 *
 * Unit = token: the probability that the regular token nearest to φ(x) + N is x itself, for x
 * uniform over the bundle's regular tokens. Estimated without sampling radii: along a direction
 * u the nearest-token cell of x (convex) is left at distance
 * s*(x, u) = min over t with u·(t−x) > 0 of ‖t−x‖² / (2 u·(t−x)), so
 * Pr[unchanged | x, u] = Pr[Gamma(n, 1) ≤ η s*], averaged over 1,000 pairs (x, u). The pairs are
 * drawn as shared.floor draws them (numpy's default_rng(0), reproduced by {@link Pcg64Source}),
 * so both edges judge the same pairs; only float32 rounding of the products differs.
 */

import type { EdgeBundle } from "./bundle.js";
import { fmtG } from "./dchi.js";
import { WeakPrivacyError } from "./errors.js";
import type { ExactNearest } from "./nearest.js";
import { Pcg64Source } from "./pcg64.js";
import { choiceWithoutReplacement, permutation, standardNormal } from "./samplers.js";

export const THRESHOLD = 0.99;
export const FLOOR_TOKENS = 1000;
export const DIRECTIONS = 256;

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
   * The pairs' exit distances, from the search's float32 products (``index`` is the exact
   * search over the same regular table, rows × dim).
   */
  static async compute(table: Float32Array, rows: number, dim: number, index: ExactNearest,
                       tokens = FLOOR_TOKENS, seed = 0, chunk = 256): Promise<DChiFloor> {
    const { picked, rng, ndir } = floorPairs(rows, table.length, tokens, seed);
    const u = drawDirections(rng, ndir, dim);
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

  /**
   * Upper bounds on the exit distances of the same pairs, from the rows ``subset`` of the table
   * only (``index`` searches those rows): a minimum over fewer rows is never smaller, so
   * {@link unchanged} of the result bounds the real figure from above. A cheap proof that an η
   * passes the floor, without the product of every pair with every row.
   *
   * Pairs are done ``chunk`` at a time (their directions drawn as they are reached, in the
   * order shared.floor draws them); after each chunk ``settled(exit, done)`` may end the work
   * (the pairs not done yet keep the exit distance Infinity). Returns the exits and how many
   * pairs were done.
   */
  static async bound(table: Float32Array, rows: number, dim: number, index: ExactNearest,
                     subset: Int32Array, settled: (exit: Float64Array, done: number) => boolean = () => false,
                     tokens = FLOOR_TOKENS, seed = 0, chunk = 64): Promise<{ exit: Float64Array; done: number }> {
    const { picked, rng, ndir } = floorPairs(rows, table.length, tokens, seed);
    const same = twinGroups(table, rows, dim, picked);
    const k = subset.length;
    const u = new Float64Array(ndir * dim);
    const ut = new Float32Array(ndir * k);
    let drawn = 0; // directions drawn so far, and their products with the subset
    const exit = new Float64Array(picked.length).fill(Infinity);
    for (let s0 = 0; s0 < picked.length; s0 += chunk) {
      const c = Math.min(chunk, picked.length - s0);
      const want = Math.min(ndir, s0 + c);
      if (want > drawn) {
        u.set(drawDirections(rng, want - drawn, dim), drawn * dim);
        const p = await index.scores(u.subarray(drawn * dim, want * dim), want - drawn, false);
        for (let i = 0; i < p.length; i++) ut[drawn * k + i] = -0.5 * p[i]!;
        drawn = want;
      }
      const x = new Float64Array(c * dim);
      for (let i = 0; i < c; i++) x.set(table.subarray(picked[s0 + i]! * dim, (picked[s0 + i]! + 1) * dim), i * dim);
      const d = await index.scores(x, c);
      for (let i = 0; i < c; i++) {
        const r = picked[s0 + i]!;
        const w = (s0 + i) % ndir;
        let ux = 0;
        let xn = 0;
        for (let q = 0; q < dim; q++) {
          ux += u[w * dim + q]! * x[i * dim + q]!;
          xn += x[i * dim + q]! ** 2;
        }
        const group = same.get(r);
        let best = 0;
        for (let j = 0; j < k; j++) {
          const v = subset[j]!;
          if (v === r || (group !== undefined && group.includes(v))) continue;
          const dd = d[i * k + j]! + xn;
          const a = ut[w * k + j]! - ux;
          if (dd > 0 && a > 0 && a / dd > best) best = a / dd;
        }
        exit[s0 + i] = best > 0 ? 0.5 / best : Infinity;
      }
      if (s0 + c < picked.length && settled(exit, s0 + c)) return { exit, done: s0 + c };
    }
    return { exit, done: picked.length };
  }

  /** Estimated Pr[the nearest regular token of φ(x) + N is x] at ``eta``. */
  unchanged(eta: number): number {
    let s = 0;
    for (const e of this.exit) s += gammaCdf(this.dim, eta * e);
    return s / this.exit.length;
  }

  /** The smallest η (to ``rtol``) at which {@link unchanged} exceeds ``threshold``; Infinity if
   * none does, 0 if every η does. */
  floorEta(threshold = THRESHOLD, rtol = 1e-4): number {
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

/** The floor's pairs as shared.floor draws them from default_rng(seed): the token of each pair
 * (rows of the regular table), the generator after those draws (the directions come next) and
 * how many distinct directions there are. */
function floorPairs(rows: number, size: number, tokens: number, seed: number
): { picked: Int32Array; rng: Pcg64Source; ndir: number } {
  const rng = new Pcg64Source(seed);
  let picked: Int32Array;
  if (tokens >= rows) {
    const p = permutation(rng, rows);
    picked = Int32Array.from({ length: tokens }, (_, i) => p[i % rows]!); // np.resize
  } else {
    picked = choiceWithoutReplacement(rng, rows, tokens);
  }
  const ndir = size * picked.length <= 5e8 ? picked.length : Math.min(picked.length, DIRECTIONS);
  return { picked, rng, ndir };
}

/** The next ``count`` directions of ``rng``: standard normals, row by row, each row divided by
 * its norm and rounded to float32 (shared.floor's order and rounding). */
function drawDirections(rng: Pcg64Source, count: number, dim: number): Float64Array {
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

function pct(p: number): string {
  return p >= 1 ? "100%" : `${(100 * p).toFixed(2)}%`;
}

/** None (null) if dχ at ``eta`` passes the floor, else the one-line reason, worded as
 * shared.floor's. */
export function dchiWeakReason(name: "dchi-text" | "dchi-embedding", eta: number, floor: DChiFloor,
                               threshold = THRESHOLD): string | null {
  const head = `${name} eta=${fmtG(eta)} is weaker than the privacy floor`;
  if (!Number.isFinite(eta * 2 * floor.tMax)) {
    return `${head}: the worst-case epsilon per token (eta x 2 max||phi||) is not finite`;
  }
  const p = floor.unchanged(eta);
  if (p <= threshold) return null;
  const what = name === "dchi-text" ? "come back unchanged" : "are their own nearest token after the noise";
  return `${head}: ${pct(p)} of tokens ${what} (floor ${pct(threshold)}; on this bundle `
    + `it starts at eta=${fmtG(floor.floorEta(threshold), 4)})`;
}

/** Throw {@link WeakPrivacyError} when dχ at ``eta`` is weaker than the floor, unless
 * ``allowWeak``; return the reason (null if it passes). */
export function requireDchiFloor(name: "dchi-text" | "dchi-embedding", eta: number, floor: DChiFloor,
                                 allowWeak = false): string | null {
  const why = dchiWeakReason(name, eta, floor);
  if (why !== null && !allowWeak) throw new WeakPrivacyError(why);
  return why;
}

/** What a floor cache keeps per bundle (the exit distances, a few KB; keys are the bundle id,
 * or the bundle id and ".bound128" / ".bound2048" for the cheap upper bounds'). */
export interface FloorCache {
  get(bundleId: string): Promise<Float64Array | null>;
  put(bundleId: string, exit: Float64Array): Promise<void>;
}

/** The floor of a bundle: from ``cache`` when it has it, else computed (and cached). */
export async function bundleFloor(bundle: EdgeBundle, index: ExactNearest,
                                  cache?: FloorCache | null): Promise<DChiFloor> {
  const reg = bundle.regularIds;
  const cached = cache ? await cache.get(bundle.bundleId) : null;
  if (cached && cached.length === FLOOR_TOKENS) return new DChiFloor(bundle.dim, cached, bundle.regularMaxNorm);
  const floor = await DChiFloor.compute(bundle.regularTable, reg.length, bundle.dim, index);
  if (cache) await cache.put(bundle.bundleId, floor.exit);
  return floor;
}

/** Rows of the cheap upper bounds, tried in turn: the first settles an η well inside the
 * floor for a few tens of milliseconds, the second one nearer it. */
export const BOUND_ROWS = [128, 2048] as const;
const BOUND_SLACK = 1 + 1e-4; // covers float32 rounding between the bound's products and the floor's

/**
 * Whether ``rows`` regular rows drawn by a fixed seed prove that dχ at ``eta`` passes the floor:
 * their upper bounds on the pairs' exit distances give at most {@link THRESHOLD} unchanged
 * tokens. A pair not computed yet counts as unchanged for sure (exit Infinity), so the work
 * stops as soon as the pairs done prove it; a bound computed in full (it did not prove it) is
 * kept in ``cache`` for the next η.
 */
async function boundSettles(bundle: EdgeBundle, eta: number, rows: number, cache: FloorCache | null,
                            makeIndex: (table: Float32Array, rows: number) => Promise<ExactNearest>
): Promise<boolean> {
  const key = `${bundle.bundleId}.bound${rows}`;
  const dim = bundle.dim;
  const passes = (exit: Float64Array, done: number): boolean => {
    let s = exit.length - done;
    for (let i = 0; i < done; i++) s += gammaCdf(dim, eta * BOUND_SLACK * exit[i]!);
    return s / exit.length <= THRESHOLD;
  };
  const cached = cache ? await cache.get(key) : null;
  if (cached && cached.length === FLOOR_TOKENS) return passes(cached, cached.length);
  const reg = bundle.regularIds;
  const pick = choiceWithoutReplacement(new Pcg64Source(1), reg.length, rows).sort();
  const table = bundle.regularTable;
  const sub = new Float32Array(rows * dim);
  for (let j = 0; j < rows; j++) sub.set(table.subarray(pick[j]! * dim, (pick[j]! + 1) * dim), j * dim);
  const small = await makeIndex(sub, rows);
  try {
    const { exit, done } = await DChiFloor.bound(table, reg.length, dim, small, pick, passes);
    if (done < exit.length) return true;
    if (cache) await cache.put(key, exit);
    return passes(exit, done);
  } finally {
    await small.release();
  }
}

/**
 * Check dχ at ``eta`` against the floor of ``bundle``, as shared.floor.require_privacy_floor:
 * null when it passes, else the reason (thrown as {@link WeakPrivacyError} unless
 * ``allowWeak``). Computing the floor takes a product of 1,000 tokens with every row; an η that
 * passes is first tried against upper bounds from {@link BOUND_ROWS} rows
 * ({@link DChiFloor.bound}: a minimum over fewer rows is never smaller, so the fraction of
 * unchanged tokens they give is never below the floor's), and the full floor is computed (and
 * cached) only when none settles it: an η near the floor, or one past it (the refusal quotes
 * the full floor's figures).
 */
export async function checkDchiFloor(name: "dchi-text" | "dchi-embedding", eta: number,
                                     bundle: EdgeBundle, index: ExactNearest,
                                     options: { cache?: FloorCache | null; allowWeak?: boolean;
                                       makeIndex?: (table: Float32Array, rows: number) => Promise<ExactNearest> } = {}
): Promise<string | null> {
  const cache = options.cache ?? null;
  const cached = cache ? await cache.get(bundle.bundleId) : null;
  if (!(cached && cached.length === FLOOR_TOKENS) && options.makeIndex
      && Number.isFinite(eta * 2 * bundle.regularMaxNorm)) {
    for (const rows of BOUND_ROWS) {
      if (bundle.regularIds.length <= rows) break;
      if (await boundSettles(bundle, eta, rows, cache, options.makeIndex)) return null;
    }
  }
  const floor = await bundleFloor(bundle, index, options.cache);
  return requireDchiFloor(name, eta, floor, options.allowWeak ?? false);
}
