/**
 * Exact Euclidean nearest row of an embedding table, proven by a bound (the rule of
 * shared/mechanisms/nearest.py, which dχ-text needs: approximate indexes change the mechanism).
 *
 * 1. Candidate pass in float32: s(t) = ‖t‖² − 2 y·t from one product of the queries
 *    [y, 1, 0 …] with the table stored as [−2t, ‖t‖², 0 …] (width padded to a multiple of 16).
 * 2. Every float32 score is within δ(y) = 4 γ_{w+4} (2‖y‖ t_max + t_max²) of the real score
 *    (rounding of y, of ‖t‖² and of the dot product in any summation order: Higham, *Accuracy
 *    and Stability of Numerical Algorithms*, §3.1, γ_n = n u / (1 − n u)). Every row whose
 *    float32 score is within 2δ of the smallest one could be the nearest; all others cannot.
 * 3. Those candidates (almost always one) are re-ranked by ‖y − t‖² in float64; ties go to the
 *    smallest row.
 *
 * Where a query's work (rows × dim multiply-adds) is large — a vocabulary of 384-d rows — the
 * candidate pass is the int8 pass of shared/mechanisms/int8_pass.py instead
 * ({@link Int8CandidatePass}: its own proven bound, a quarter of the float32 table's bytes),
 * where onnxruntime-web's integer kernel proves exact here; a query it cannot narrow to a few
 * candidates takes the float32 pass above. Below {@link LARGE_WORK} (a compact table: 29,523
 * rows × 32) the float32 pass is the plain JS loop, and onnxruntime-web (its WebAssembly, 2.4 MB
 * brotli) is never loaded. All are exact, so which one runs changes no result.
 */

import { nextUpF32 } from "./float32.js";
import { COMPUTABLE, INT8_PASS } from "../generated/spec.js";
import { Int8CandidatePass, sqDist } from "./int8_pass.js";
import { ortAtHand } from "../runtime/ort.js";
import { LoopTableProduct, OrtTableProduct, type OrtOptions, type TableProduct } from "./table_product.js";

export { nextUpF32 } from "./float32.js";

const U32: number = INT8_PASS.U; // 2^-24: unit roundoff of float32 (shared.mechanisms.int8_pass.U)
const F32_MAX: number = COMPUTABLE.F32_MAX;
/** Multiply-adds per query (rows × dim) from which the search uses onnxruntime-web's kernels;
 * below, the plain JS loop (bench/results/web_edge.md: on a 29,523 × 32 table the loop takes
 * about 2 ms a query, no WebAssembly to fetch; a 30,522 × 384 table is 12× the work). */
export const LARGE_WORK = 1 << 21;
/** Multiply-adds per query from which a search on the plain loop switches to the int8 pass once
 * onnxruntime-web is at hand (started by the page, or in Node): a compact table's loop costs
 * about 35 ms of CPU per 20-token sentence, the int8 pass about 5 (bench/results/web_edge.md). */
export const UPGRADE_WORK = 1 << 18;

/** Whether the exact search over a table of ``rows`` × ``dim`` (with the "auto" backend) runs
 * on onnxruntime-web, so that a page needs its WebAssembly. */
export function searchUsesOrt(rows: number, dim: number): boolean {
  return rows * dim >= LARGE_WORK;
}

/** Whether float32 scores ‖t‖² − 2 y·t of queries of norm up to ``queryNorm`` against rows of norm
 * up to ``tMax`` (with room for the error bound) can overflow. */
export function scoresOverflow(queryNorm: number, tMax: number): boolean {
  return (queryNorm + 1) * (2 * tMax + tMax * tMax + 1) * 16 > F32_MAX;
}

export interface NearestOptions extends OrtOptions {
  /** The candidate pass: "int8" (onnxruntime-web's integer kernel; an error where it is not
   * exact), "ort" (onnxruntime-web's float32 MatMul), "loop" (plain JS), or "auto" (the
   * default): int8 for tables of {@link LARGE_WORK} multiply-adds a query (rows × dim) and
   * more, where it is exact, else ort; below, loop, which loads no onnxruntime-web; from
   * {@link UPGRADE_WORK}, int8 where onnxruntime-web is at hand (Node; a page that started it),
   * and a loop search switches to int8 once the page starts onnxruntime-web (e.g. `warmUp`
   * after the first privatization). Every backend gives the same rows. */
  backend?: "int8" | "ort" | "loop" | "auto";
  /** Queries per product (default 256). */
  chunk?: number;
  /** ‖t‖² of the table's rows (float64), when the caller has them already. */
  norms?: Float64Array;
}

/** Exact L2 nearest row of a float32 table for batches of float64 queries. */
export class ExactNearest {
  readonly dim: number;
  readonly rows: number;
  /** Queries decided in float64 by the last search (near ties). */
  lastRerankCount = 0;
  /** Queries the int8 pass handed to the float32 pass in the last search. */
  lastFallbackCount = 0;
  private readonly width: number;
  private readonly gamma: number;
  private readonly tMax: number;
  private readonly chunk: number;
  /** the float32 product of the search ("ort", "loop"; null with int8) */
  private readonly f32: TableProduct | null;
  /** onnxruntime-web's float32 MatMul for {@link scores} on a large table, built on first use */
  private ortF32: Promise<OrtTableProduct> | null;
  private loop: LoopTableProduct | null = null;
  /** the int8 pass being built once onnxruntime-web is at hand (auto on a mid-sized table) */
  private upgrading: Promise<void> | null = null;
  private upgradable = false;

  private constructor(private readonly table: Float32Array, rows: number, dim: number,
                      private readonly ids: Int32Array, private readonly norms: Float64Array,
                      /** the float32 product of the search (null: built when first needed) */
                      f32: TableProduct | null,
                      private int8: Int8CandidatePass | null,
                      tMax: number, width: number, chunk: number,
                      private readonly threads: number) {
    this.rows = rows;
    this.dim = dim;
    this.tMax = tMax;
    this.width = width;
    const terms = width + 4;
    this.gamma = (terms * U32) / (1 - terms * U32);
    this.chunk = chunk;
    this.f32 = f32;
    this.ortF32 = f32 instanceof OrtTableProduct ? Promise.resolve(f32) : null;
    if (f32 instanceof LoopTableProduct) this.loop = f32;
  }

  /**
   * The search over ``table`` (rows × dim, row-major float32, read in place: not copied);
   * ``ids`` maps rows to the ids returned (default: the row numbers).
   */
  static async create(table: Float32Array, rows: number, dim: number, ids?: Int32Array | null,
                      options: NearestOptions = {}): Promise<ExactNearest> {
    if (rows < 1 || dim < 1 || table.length !== rows * dim) {
      throw new RangeError(`table must be a non-empty rows × dim array, got ${table.length} values for ${rows} × ${dim}`);
    }
    const idMap = ids ?? Int32Array.from({ length: rows }, (_, i) => i);
    if (idMap.length !== rows) throw new RangeError("ids must have one entry per table row");
    const width = Math.ceil((dim + 1) / 16) * 16;
    let norms = options.norms;
    if (norms !== undefined && norms.length !== rows) throw new RangeError("norms must have one entry per table row");
    if (norms === undefined) {
      norms = new Float64Array(rows);
      for (let v = 0; v < rows; v++) {
        let n2 = 0;
        for (let k = v * dim; k < (v + 1) * dim; k++) n2 += table[k]! * table[k]!;
        norms[v] = n2;
      }
    }
    let maxNorm2 = 0;
    for (const n2 of norms) if (n2 > maxNorm2) maxNorm2 = n2;
    const threads = Math.max(1, Math.floor(options.threads ?? 1));
    const asked = options.backend ?? "auto";
    let int8: Int8CandidatePass | null = null;
    const large = searchUsesOrt(rows, dim);
    const upgradable = asked === "auto" && !large && rows * dim >= UPGRADE_WORK;
    if (asked === "int8" || (asked === "auto" && large) || (upgradable && ortAtHand())) {
      int8 = await Int8CandidatePass.create(table, rows, dim, norms, threads);
      if (int8 === null && asked === "int8") {
        throw new RangeError("the int8 candidate pass cannot run here: onnxruntime-web's integer kernel is not exact");
      }
    }
    const backend = int8 !== null ? "int8" : asked === "auto" ? (large ? "ort" : "loop") : asked;
    const f32 = backend === "ort" ? await OrtTableProduct.create(table, norms, rows, dim, width, { threads })
      : backend === "loop" ? new LoopTableProduct(table, norms, rows, dim, width) : null;
    const index = new ExactNearest(table, rows, dim, idMap, norms, f32, int8, Math.sqrt(maxNorm2), width,
      Math.max(1, Math.floor(options.chunk ?? 256)), threads);
    index.upgradable = upgradable && int8 === null && backend === "loop";
    return index;
  }

  /** On a loop search that may switch: once onnxruntime-web is at hand, build the int8 pass
   * in the background (searches meanwhile stay on the loop; both are exact). */
  private maybeUpgrade(): void {
    if (!this.upgradable || this.upgrading !== null || !ortAtHand()) return;
    this.upgrading = Int8CandidatePass.create(this.table, this.rows, this.dim, this.norms, this.threads)
      .then((pass) => {
        if (pass !== null && this.upgradable) this.int8 = pass;
        else void pass?.release();
      })
      .catch(() => undefined);  // not exact here, or no runtime: the loop stays
  }

  /** Which candidate pass searches: "int8", or the float32 product ("ort", "loop"). */
  get backend(): "int8" | "ort" | "loop" {
    if (this.int8 !== null) return "int8";
    return this.f32 instanceof OrtTableProduct ? "ort" : "loop";
  }

  /** The float32 product for {@link scores}: onnxruntime-web's MatMul on a large table (built
   * on first use when the search does not hold one: the privacy floor's estimate), the plain
   * loop on a small one (onnxruntime-web is not loaded for it). */
  private product(): Promise<TableProduct> {
    if (this.ortF32 === null && !searchUsesOrt(this.rows, this.dim)) return Promise.resolve(this.loopProduct());
    this.ortF32 ??= OrtTableProduct.create(this.table, this.norms, this.rows, this.dim, this.width,
      { threads: this.threads });
    return this.ortF32;
  }

  private loopProduct(): LoopTableProduct {
    this.loop ??= new LoopTableProduct(this.table, this.norms, this.rows, this.dim, this.width);
    return this.loop;
  }

  /** Upper bound on |float32 score − real score| for a query of norm ``queryNorm``. */
  scoreBound(queryNorm: number): number {
    const t = this.tMax;
    return 4 * this.gamma * (2 * queryNorm * t + t * t);
  }

  /** The float32 scores ‖t‖² − 2 y·t of ``m`` queries against every row (m × rows); with
   * ``withNorms`` false, −2 y·t. */
  async scores(queries: Float64Array | Float32Array, m: number, withNorms = true,
               product?: TableProduct): Promise<Float32Array> {
    const y = new Float32Array(m * this.width);
    for (let i = 0; i < m; i++) {
      for (let k = 0; k < this.dim; k++) y[i * this.width + k] = queries[i * this.dim + k]!;
      y[i * this.width + this.dim] = withNorms ? 1 : 0;
    }
    return (product ?? await this.product()).run(y, m);
  }

  /** Ids of the exact nearest rows of the ``queries`` (m × dim, row-major float64). */
  async search(queries: Float64Array): Promise<Int32Array> {
    const rows = await this.searchRows(queries, null);
    return rows.map((r) => this.ids[r]!);
  }

  /**
   * For the table's rows ``which`` (row numbers), the nearest *other* row of each (−1 if the
   * table has no other row) and its squared distance ‖t_r − t_j‖², summed in float64: the same
   * exact search, with the row itself left out (the privacy floor's near-duplicate check).
   */
  async nearestOther(which: Int32Array): Promise<{ rows: Int32Array; dist2: Float64Array }> {
    const q = new Float64Array(which.length * this.dim);
    for (let i = 0; i < which.length; i++) {
      const r = which[i]!;
      if (!(r >= 0 && r < this.rows)) throw new RangeError(`row ${r} is outside the table [0, ${this.rows})`);
      for (let k = 0; k < this.dim; k++) q[i * this.dim + k] = this.table[r * this.dim + k]!;
    }
    const rows = await this.searchRows(q, which);
    const dist2 = new Float64Array(which.length).fill(Infinity);
    rows.forEach((j, i) => {
      if (j >= 0) dist2[i] = sqDist(q, i * this.dim, this.table, j * this.dim, this.dim);
    });
    return { rows, dist2 };
  }

  /**
   * Bounds [lo, hi] on the squared distance from each of the table's rows ``which`` to its
   * nearest other row: from the int8 candidate pass's scores alone where it runs (one integer
   * GEMM, no search: rows whose bounds decide a question need nothing more), else exact
   * (lo = hi, {@link nearestOther}).
   */
  async nearestOtherBounds(which: Int32Array): Promise<{ lo: Float64Array; hi: Float64Array }> {
    if (this.int8 === null) {
      const { dist2 } = await this.nearestOther(which);
      return { lo: dist2, hi: Float64Array.from(dist2) };
    }
    const lo = new Float64Array(which.length);
    const hi = new Float64Array(which.length);
    for (let s0 = 0; s0 < which.length; s0 += this.chunk) {
      const rows = which.subarray(s0, Math.min(which.length, s0 + this.chunk));
      const q = new Float64Array(rows.length * this.dim);
      rows.forEach((r, i) => {
        if (!(r >= 0 && r < this.rows)) throw new RangeError(`row ${r} is outside the table [0, ${this.rows})`);
        for (let k = 0; k < this.dim; k++) q[i * this.dim + k] = this.table[r * this.dim + k]!;
      });
      await this.int8.nearestBounds(q, rows.length, rows, lo.subarray(s0), hi.subarray(s0));
    }
    const missing = Int32Array.from(which.filter((_, i) => Number.isNaN(lo[i]!)));
    if (missing.length) {
      const { dist2 } = await this.nearestOther(missing);
      let k = 0;
      which.forEach((_, i) => {
        if (Number.isNaN(lo[i]!)) lo[i] = hi[i] = dist2[k++]!;
      });
    }
    return { lo, hi };
  }

  /** Rows of the exact nearest rows of the ``queries``, query i never answered by row
   * ``exclude[i]`` (null: none left out). */
  private async searchRows(queries: Float64Array, exclude: Int32Array | null): Promise<Int32Array> {
    if (queries.length % this.dim !== 0) {
      throw new RangeError(`queries must have shape (m, ${this.dim})`);
    }
    const m = queries.length / this.dim;
    let top = 0;
    for (let i = 0; i < queries.length; i++) {
      const a = Math.abs(queries[i]!);
      if (!Number.isFinite(a)) throw new RangeError("queries contain NaN or Inf");
      if (a > top) top = a;
    }
    if (top > 0 && scoresOverflow(top * Math.sqrt(this.dim), this.tMax)
        && scoresOverflow(this.maxNorm(queries, m, top), this.tMax)) {
      throw new RangeError("queries are too large for the float32 candidate pass (their scores would overflow)");
    }
    this.maybeUpgrade();
    this.lastRerankCount = 0;
    this.lastFallbackCount = 0;
    const out = new Int32Array(m);
    const rows = new Int32Array(Math.min(this.chunk, m));
    for (let start = 0; start < m; start += this.chunk) {
      const k = Math.min(this.chunk, m - start);
      const block = queries.subarray(start * this.dim, (start + k) * this.dim);
      const skip = exclude === null ? null : exclude.subarray(start, start + k);
      if (this.int8 !== null) {
        this.lastRerankCount += await this.int8.searchChunk(block, k, rows, skip);
        const back: number[] = [];
        for (let i = 0; i < k; i++) {
          if (rows[i]! >= 0) out[start + i] = rows[i]!;
          else back.push(i);
        }
        // the few it hands back: the float32 pass, by the plain loop
        for (const i of back) {
          const q = block.subarray(i * this.dim, (i + 1) * this.dim);
          const s = await this.scores(q, 1, true, this.loopProduct());
          out[start + i] = this.decide(q, 0, s, skip === null ? -1 : skip[i]!);
        }
        this.lastFallbackCount += back.length;
        continue;
      }
      const s = await this.scores(block, k, true, this.f32!);
      for (let i = 0; i < k; i++) out[start + i] = this.decide(block, i, s, skip === null ? -1 : skip[i]!);
    }
    return out;
  }

  /** The row of the nearest neighbour of query ``i`` of a block, from its float32 scores; row
   * ``exclude`` is never the answer (−1 when it is the only row). */
  private decide(block: Float64Array, i: number, s: Float32Array, exclude = -1): number {
    const rows = this.rows;
    const off = i * rows;
    let best = -1;
    let smin = Infinity;
    for (let v = 0; v < rows; v++) {
      const x = s[off + v]!;
      if (v !== exclude && (best < 0 || x < smin)) {
        smin = x;
        best = v;
      }
    }
    if (best < 0) return -1;
    let yn2 = 0;
    for (let k = 0; k < this.dim; k++) yn2 += block[i * this.dim + k]! ** 2;
    // threshold in float64, then rounded up to float32 so that no candidate is lost
    const thr32 = nextUpF32(smin + 2 * this.scoreBound(Math.sqrt(yn2)));
    const cands: number[] = [];
    for (let v = 0; v < rows; v++) if (v === best || (v !== exclude && s[off + v]! <= thr32)) cands.push(v);
    if (cands.length === 1) return best;
    this.lastRerankCount++;
    let bestD = Infinity;
    let bestRow = -1;
    for (const v of cands) { // increasing rows: a strict < keeps the smallest row on a tie
      const d = sqDist(block, i * this.dim, this.table, v * this.dim, this.dim);
      if (d < bestD) {
        bestD = d;
        bestRow = v;
      }
    }
    return bestRow;
  }

  /** The largest row norm of the queries, without overflow (rows scaled by 1/top first). */
  private maxNorm(q: Float64Array, m: number, top: number): number {
    let best = 0;
    for (let i = 0; i < m; i++) {
      let s = 0;
      for (let k = 0; k < this.dim; k++) s += (q[i * this.dim + k]! / top) ** 2;
      if (s > best) best = s;
    }
    return top * Math.sqrt(best);
  }

  async release(): Promise<void> {
    this.upgradable = false;
    await this.upgrading;
    await this.int8?.release();
    const ort = this.ortF32;
    this.ortF32 = null;
    if (ort) await (await ort).release();
  }
}
