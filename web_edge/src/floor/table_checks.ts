/**
 * Degenerate privatization tables (shared/floor.py's `table_problem`): identical regular rows
 * (all of them compared), or regular rows nearer to another than 1e-3 × the median
 * nearest-row distance of a sample drawn afresh at every check. No honest projection makes
 * either; a hostile server's table can (issue 34), and the floor refuses it.
 *
 * The near-duplicate count is shared.floor's, decided exactly, at little cost on an honest
 * table: every row's distance to a few others bounds its nearest distance from above, so the
 * median of those bounds gives a threshold T ≥ 1e-3 × the real median; a row with no other
 * row within T cannot count, and a row within T of it must lie within T of it in every
 * coordinate (|x_k − t_k| ≤ ‖x − t‖), which a sorted coordinate and a few others find
 * without a product with the table. Only when some row has a neighbour within T (a table
 * that may well be refused) are the nearest distances computed, by the exact search.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import { FLOOR } from "../generated/spec.js";
import { message } from "../format/messages.js";
import type { ExactNearest } from "../search/nearest.js";
import type { BitSource } from "../random/random.js";
import { choiceWithoutReplacement } from "../random/samplers.js";

/** rows nearer than this share of the median nearest-row distance are near-duplicates
 * (shared.floor.NEAR_DUPLICATE, from the spec) */
export const NEAR_DUPLICATE: number = FLOOR.NEAR_DUPLICATE;
/** rows whose nearest other row is measured (drawn afresh at each check) */
export const DUPLICATE_SAMPLE: number = FLOOR.DUPLICATE_SAMPLE;
const FILTER_COORDS = 4; // coordinates checked per candidate, the widest spread first
const NEIGHBOURS = 4; // rows beside a row in the sorted coordinate: its upper bounds
const SPREAD_ROWS = 2048; // rows whose spread picks the coordinates
const F32_TINY = 2 ** -126; // float32's smallest normal number (numpy's finfo(float32).tiny)


/** Why the regular rows hold non-finite values or identical rows (bit for bit, as numpy's
 * unique over their bytes), else null. */
export function identicalRows(bundle: EdgeBundle): string | null {
  const t = bundle.regularTable;
  const n = bundle.regularIds.length;
  const dim = bundle.tableDim;
  // a non-finite value makes its row's norm² (float64 sums of float32 squares) non-finite
  for (const q of bundle.regularNorms2()) if (!Number.isFinite(q)) return message("TABLE_NON_FINITE");
  // subnormal values: the distances between such rows are lost to rounding (a table scaled by 1e-39)
  let subnormal = 0;
  for (let i = 0; i < t.length; i++) {
    const x = Math.abs(t[i]!);
    if (x !== 0 && x < F32_TINY) subnormal++;
  }
  if (subnormal) return message("TABLE_SUBNORMAL", { values: subnormal });
  const raw = new Uint32Array(t.buffer, t.byteOffset, t.length);
  // -0.0 is the same point as 0.0: its bits read as +0.0's (numpy's unique after t + 0)
  const bit = (i: number): number => (raw[i] === 0x80000000 ? 0 : raw[i]!);
  const same = (a: number, b: number): boolean => {
    for (let k = 0; k < dim; k++) if (bit(a * dim + k) !== bit(b * dim + k)) return false;
    return true;
  };
  const buckets = new Map<number, number[][]>(); // hash of the row's bits -> groups of equal rows
  for (let v = 0; v < n; v++) {
    let h = 0x811c9dc5;
    const end = (v + 1) * dim;
    for (let k = v * dim; k < end; k++) h = Math.imul(h ^ bit(k), 0x01000193);
    const groups = buckets.get(h);
    if (groups === undefined) {
      buckets.set(h, [[v]]);
      continue;
    }
    const g = groups.find((x) => same(x[0]!, v));
    if (g) g.push(v);
    else groups.push([v]);
  }
  let rows = 0;
  let tokens = 0;
  for (const groups of buckets.values()) {
    for (const g of groups) {
      if (g.length > 1) {
        rows++;
        tokens += g.length;
      }
    }
  }
  if (rows === 0) return null;
  return message("TABLE_IDENTICAL", { tokens, rows: n, groups: rows });
}

export function median(x: Float64Array): number {
  const s = Float64Array.from(x).sort();
  const m = s.length;
  return m % 2 ? s[(m - 1) / 2]! : (s[m / 2 - 1]! + s[m / 2]!) / 2;
}

/** The regular table's coordinates by decreasing spread, and its rows sorted by the first. */
interface Sorted {
  coords: number[];
  order: Int32Array;
  values: Float64Array; // the first coordinate, in that order
  rank: Int32Array; // row -> its position in order
}

const SORTED = new WeakMap<EdgeBundle, Sorted>(); // derived from a verified bundle's content only

function sorted(bundle: EdgeBundle): Sorted {
  let s = SORTED.get(bundle);
  if (s !== undefined) return s;
  const t = bundle.regularTable;
  const n = bundle.regularIds.length;
  const dim = bundle.tableDim;
  // the spread of each coordinate on an evenly strided sample of rows: which coordinates
  // filter best only sets the speed, never the answer
  const stride = Math.max(1, Math.floor(n / SPREAD_ROWS));
  const sum = new Float64Array(dim);
  const sum2 = new Float64Array(dim);
  let m = 0;
  for (let v = 0; v < n; v += stride, m++) {
    for (let k = 0; k < dim; k++) {
      const x = t[v * dim + k]!;
      sum[k] = sum[k]! + x; // k < dim, the arrays' length
      sum2[k] = sum2[k]! + x * x;
    }
  }
  const spread = Array.from(sum2, (q, k) => q / m - (sum[k]! / m) ** 2);
  const coords = [...spread.keys()].sort((a, b) => spread[b]! - spread[a]!).slice(0, FILTER_COORDS);
  const c0 = coords[0]!;
  // rows by their first coordinate, in one native numeric sort: each key is the value's
  // float32 bits made order-preserving (an unsigned 32-bit integer) times 2^b plus the row,
  // an integer below 2^53, so exact in a double
  const bits = new Uint32Array(t.buffer, t.byteOffset, t.length);
  const b = Math.max(1, Math.ceil(Math.log2(n + 1)));
  const keys = new Float64Array(n);
  for (let v = 0; v < n; v++) {
    const x = bits[v * dim + c0]!;
    const u = x & 0x80000000 ? ~x >>> 0 : (x | 0x80000000) >>> 0;
    keys[v] = u * 2 ** b + v;
  }
  keys.sort();
  const order = Int32Array.from(keys, (k) => k % 2 ** b);
  const values = Float64Array.from(order, (v) => t[v * dim + c0]!);
  const rank = new Int32Array(n);
  order.forEach((v, i) => {
    rank[v] = i;
  });
  s = { coords, order, values, rank };
  SORTED.set(bundle, s);
  return s;
}

function dist(t: Float32Array, dim: number, a: number, b: number): number {
  let d = 0;
  for (let k = 0; k < dim; k++) {
    const x = t[a * dim + k]! - t[b * dim + k]!;
    d += x * x;
  }
  return Math.sqrt(d);
}

/** The first position in ``values`` (ascending) whose value is >= ``x``. */
function lowerBound(values: Float64Array, x: number): number {
  let lo = 0;
  let hi = values.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (values[mid]! < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Whether no picked row has another regular row within 1e-3 × the median of upper bounds on
 * their nearest distances (then none is a near-duplicate); false: it could not be shown. */
function noneNear(bundle: EdgeBundle, picked: Int32Array): boolean {
  const t = bundle.regularTable;
  const dim = bundle.tableDim;
  const n = bundle.regularIds.length;
  const s = sorted(bundle);
  const upper = Float64Array.from(picked, (r) => {
    const p = s.rank[r]!;
    let best = Infinity;
    for (let q = Math.max(0, p - NEIGHBOURS / 2); q <= Math.min(n - 1, p + NEIGHBOURS / 2); q++) {
      if (q !== p) best = Math.min(best, dist(t, dim, r, s.order[q]!));
    }
    return best;
  });
  const limit = NEAR_DUPLICATE * median(upper) * (1 + 1e-9); // rounding: a wider net is still sound
  if (!(limit > 0) || !Number.isFinite(limit)) return false;
  const c0 = s.coords[0]!;
  const rest = Int32Array.from(s.coords.slice(1));
  for (const r of picked) {
    const x0 = t[r * dim + c0]!;
    candidates: for (let q = lowerBound(s.values, x0 - limit); q < n && s.values[q]! <= x0 + limit; q++) {
      const v = s.order[q]!;
      if (v === r) continue;
      for (const k of rest) if (Math.abs(t[r * dim + k]! - t[v * dim + k]!) > limit) continue candidates;
      if (dist(t, dim, r, v) <= limit) return false;
    }
  }
  return true;
}

/**
 * Regular rows nearer to another than {@link NEAR_DUPLICATE} of the median nearest-row
 * distance, among {@link DUPLICATE_SAMPLE} drawn from ``source`` (numpy's choice: the Python
 * edge's rows for the same generator): shared.floor's clause, or null. ``index``: the exact
 * search over the regular table.
 */
export async function nearDuplicates(bundle: EdgeBundle, index: ExactNearest, source: BitSource): Promise<string | null> {
  const reg = bundle.regularIds.length;
  const n = Math.min(DUPLICATE_SAMPLE, reg);
  if (n < 2) return null;
  const picked = choiceWithoutReplacement(source, reg, n);
  if (noneNear(bundle, picked)) return null;
  // bounds on every nearest distance from the int8 pass's scores; the exact search for a row
  // whose bounds leave its answer open (d_i < 1e-3 median(d): certain when
  // hi_i < 1e-3 median(lo), certainly not when lo_i >= 1e-3 median(hi)), and for all of them
  // when the median itself stays too loose
  const b = await index.nearestOtherBounds(picked);
  const lo = b.lo.map((d) => Math.sqrt(Math.max(d, 0)));
  const hi = b.hi.map((d) => Math.sqrt(Math.max(d, 0)));
  const exact = async (which: number[]): Promise<void> => {
    if (which.length === 0) return;
    const { dist2 } = await index.nearestOther(Int32Array.from(which, (i) => picked[i]!));
    which.forEach((i, k) => {
      lo[i] = hi[i] = Math.sqrt(Math.max(dist2[k]!, 0));
    });
  };
  const all = [...lo.keys()];
  const open = (): number[] => {
    const [mLo, mHi] = [median(lo), median(hi)];
    return all.filter((i) => !(hi[i]! < NEAR_DUPLICATE * mLo) && !(lo[i]! >= NEAR_DUPLICATE * mHi));
  };
  await exact(open());
  const mLo = median(lo);
  if (open().length || (mLo !== median(hi) && (mLo === 0 || all.some((i) => hi[i]! < NEAR_DUPLICATE * mLo)))) {
    await exact(all.filter((i) => lo[i] !== hi[i])); // the median and "median > 0" exactly
  }
  const med = median(hi);
  let close = 0;
  for (const d of hi) if (d < NEAR_DUPLICATE * med) close++;
  if (med > 0 && close) {
    return message("TABLE_NEAR_DUPLICATES", { close, n, near: NEAR_DUPLICATE });
  }
  return null;
}
