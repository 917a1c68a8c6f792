/**
 * The int8 candidate pass of the exact nearest-row search, with the proven bound of
 * shared/mechanisms/int8_pass.py (its module docstring has the proof, steps 1–7; the step
 * numbers below are its). One onnxruntime `MatMulIntegerToFloat` per chunk of queries (MLAS's
 * WebAssembly SIMD integer kernel, on a quarter of the float32 pass's table bytes;
 * bench/web_edge.py times the two), whose scores come out as floats already shifted by a per-row
 * bias; a threshold
 * that provably keeps every nearest row; then the few candidates are narrowed by their own
 * bounds and a near tie is decided by ‖y − t‖² in float64, ties to the lowest row. A query with
 * more than ``cap`` candidates, or whose scale would underflow, is handed back (−1) to the
 * float32 pass.
 *
 * Which integer kernel runs is not assumed: {@link integerGemmIsExact} runs the graph on the
 * extreme operands of step 2 and the pass is not built where it is not exact.
 */

import { f32Up, nextUpF32 } from "./float32.js";
import { INT8_PASS } from "../generated/spec.js";
import { oneNodeModel } from "../runtime/onnx_model.js";
import { loadOrt, type Ort } from "../runtime/ort.js";
import { measure, now } from "../timing.js";
import { Pcg64Source } from "../random/pcg64.js";

// the bound's constants are shared.mechanisms.int8_pass's, read from the mechanism spec
/** 127² · MAX_DIM < 2^24: the integer scores are exact in int32 and float32 */
export const MAX_DIM: number = INT8_PASS.MAX_DIM;
const GAMMA4: number = INT8_PASS.GAMMA4; // 4u / (1 − 4u), u = 2^-24 (float32's unit roundoff)
const SLACK: number = INT8_PASS.SLACK; // 2^-36
const TINY: number = INT8_PASS.TINY; // 2^-100: smallest a · b_j, no float32 underflow in the kernel's multiplier
const PAD_BIAS: number = INT8_PASS.PAD_BIAS; // score of the padding rows (zero integers): never a candidate
const PAD: number = INT8_PASS.BLOCK; // rows padded to a multiple of BLOCK (MLAS's column blocks)

/**
 * Step 1 for the rows of ``t`` (rows × dim): the step b_j per row (a float32, as a number; 1
 * for a zero row) into ``b`` and the integers Q_j = round(t_j / b_j) in [−127, 127] (to
 * nearest, halves up: only f_j = t_j − b_j Q_j enters the bound, so any rounding will do) into
 * ``qT``, transposed (dim × ``stride``: the GEMM's operand layout) and shifted by ``offset``
 * (128 for a u8 operand). An s8 table (``signed``) has b_j = max_k (|t_j,2k| + |t_j,2k+1|) / 127
 * rounded up, so that adjacent pairs of |Q| sum to at most 128 (checked). With ``fnThat``, row
 * j gets 2‖f_j‖ + 2 γ4 ‖t̂_j‖ (t̂_j = b_j Q_j, f_j = t_j − t̂_j, float64): its part of the bound.
 * Rows are done in blocks so that the transposed writes stay contiguous.
 */
export function quantizeRows(t: Float32Array, rows: number, dim: number, signed: boolean,
                             b: Float64Array, qT: Int8Array | Uint8Array, stride: number,
                             offset = signed ? 0 : 128, fnThat: Float64Array | null = null): void {
  const BLK = 64;
  const blk = new Int16Array(BLK * dim);
  for (let v0 = 0; v0 < rows; v0 += BLK) {
    const nb = Math.min(BLK, rows - v0);
    for (let r = 0; r < nb; r++) {
      const v = v0 + r;
      const o = v * dim;
      let top = 0;
      if (signed) {
        for (let k = 0; k < dim; k += 2) {
          const s = Math.fround(Math.abs(t[o + k]!) + (k + 1 < dim ? Math.abs(t[o + k + 1]!) : 0));
          if (s > top) top = s;
        }
      } else {
        for (let k = 0; k < dim; k++) {
          const a = Math.abs(t[o + k]!);
          if (a > top) top = a;
        }
      }
      let step = f32Up((top * (1 + 2 ** -20)) / 127); // covers the float32 sums
      if (step === 0) step = 1;
      b[v] = step;
      let qq = 0;
      let ff = 0;
      const inv = 1 / step;
      for (let k = 0; k < dim; k++) {
        const x = t[o + k]!;
        let q = Math.round(x * inv); // any rounding to nearest: only f enters the bound
        q = q > 127 ? 127 : q < -127 ? -127 : q;
        blk[r * dim + k] = q;
        const f = x - q * step; // q·b exact (8-bit by 24-bit)
        qq += q * q;
        ff += f * f;
      }
      if (fnThat) fnThat[v] = 2 * Math.sqrt(ff) + 2 * GAMMA4 * step * Math.sqrt(qq);
      if (signed) {
        for (let k = 0; k + 1 < dim; k += 2) {
          if (Math.abs(blk[r * dim + k]!) + Math.abs(blk[r * dim + k + 1]!) > 128) {
            throw new Error("an s8 pair sum exceeds 128");
          }
        }
      }
    }
    for (let k = 0; k < dim; k++) {
      const base = k * stride + v0;
      for (let r = 0; r < nb; r++) qT[base + r] = blk[r * dim + k]! + offset;
    }
  }
}

/** The index of the smallest of ``x[from .. to)`` (the first one on a tie). */
function argmin(x: Float32Array, from: number, to: number): number {
  let k = from;
  let best = x[from]!;
  for (let j = from + 1; j < to; j++) {
    const v = x[j]!;
    if (v < best) {
      best = v;
      k = j;
    }
  }
  return k;
}

/** ‖y[yo ..] − t[to ..]‖² over ``dim`` coordinates, in float64. */
export function sqDist(y: Float64Array, yo: number, t: Float32Array, to: number, dim: number): number {
  let d = 0;
  for (let k = 0; k < dim; k++) {
    const diff = y[yo + k]! - t[to + k]!;
    d += diff * diff;
  }
  return d;
}

/** The graph O = MatMulIntegerToFloat(A u8 (m, d), B (d, n), a_scale, b_scale, 128, zp, bias)
 * for the operand ``qT`` (d × n: s8 with zero point 0, or u8 = Q + 128 with zero point 128). */
function model(qT: Int8Array | Uint8Array, d: number, n: number, bScale: Float32Array): Uint8Array {
  const signed = qT instanceof Int8Array;
  return oneNodeModel("MatMulIntegerToFloat", "com.microsoft",
    ["A", "B", "a_scale", "b_scale", "a_zp", "b_zp", "bias"],
    [{ name: "O", type: "float32", dims: ["m", n] }],
    [{ name: "A", type: "uint8", dims: ["m", d] }, { name: "a_scale", type: "float32", dims: [] },
      { name: "bias", type: "float32", dims: [n] }],
    [{ name: "B", type: signed ? "int8" : "uint8", dims: [d, n], data: qT },
      { name: "b_scale", type: "float32", dims: [n], data: bScale },
      { name: "a_zp", type: "uint8", dims: [], data: Uint8Array.of(128) },
      { name: "b_zp", type: signed ? "int8" : "uint8", dims: [], data: signed ? Int8Array.of(0) : Uint8Array.of(128) }],
    { "": 13, "com.microsoft": 1 });
}

async function session(ort: Ort, bytes: Uint8Array): Promise<import("onnxruntime-web").InferenceSession> {
  return ort.InferenceSession.create(bytes, { executionProviders: ["wasm"], graphOptimizationLevel: "all" });
}

/**
 * Whether onnxruntime-web's MatMulIntegerToFloat returns the exact integer products here for
 * the extreme operands of step 2 (a saturating kernel gets them wrong by thousands), for a
 * chunk of queries and for a single one (shared.mechanisms.int8_pass.integer_gemm_is_exact).
 * The s8 rows alternate ±127 and ±1 on adjacent coordinates (pair sums 128): a kernel that
 * paired other coordinates would saturate on them.
 */
export async function integerGemmIsExact(ort: Ort, signed: boolean, dim: number): Promise<boolean> {
  const rng = new Pcg64Source(0);
  const int = (lo: number, hi: number): number => lo + Math.floor(rng.nextDouble() * (hi - lo + 1));
  const m = 33;
  const qa = Float64Array.from({ length: m * dim }, (_, i) => (i < dim ? 127 : i < 2 * dim ? -127 : int(0, 1) ? 127 : -127));
  const special: number[][] = signed
    ? (() => {
      const alt = Array.from({ length: dim }, (_, k) => (k % 2 === 0 ? 127 : 1));
      const rev = [...alt].reverse();
      return [alt, alt.map((x) => -x), rev, rev.map((x) => -x)];
    })()
    : [new Array<number>(dim).fill(127), new Array<number>(dim).fill(-127)];
  const n = 70;
  const raw = new Float32Array(n * dim);
  special.forEach((r, j) => raw.set(r, j * dim));
  for (let i = special.length * dim; i < raw.length; i++) raw[i] = int(-127, 127);
  const qT = signed ? new Int8Array(dim * n) : new Uint8Array(dim * n);
  const b = new Float64Array(n);
  // the special rows as they are; the random ones brought under the pair constraint
  quantizeRows(raw, n, dim, signed, b, qT, n);
  const qb = new Float64Array(n * dim);
  for (let j = 0; j < n; j++) {
    for (let k = 0; k < dim; k++) {
      const q = qT[k * n + j]! - (signed ? 0 : 128);
      qb[j * dim + k] = j < special.length ? special[j]![k]! : q;
      qT[k * n + j] = qb[j * dim + k]! + (signed ? 0 : 128);
    }
  }
  const s = await session(ort, model(qT, dim, n, new Float32Array(n).fill(2 ** -7)));
  try {
    for (const rowsA of [m, 1]) {
      const a = new Uint8Array(rowsA * dim);
      for (let i = 0; i < a.length; i++) a[i] = qa[i]! + 128;
      const out = await s.run({ A: new ort.Tensor("uint8", a, [rowsA, dim]),
        a_scale: new ort.Tensor("float32", Float32Array.of(2 ** -7), []),
        bias: new ort.Tensor("float32", new Float32Array(n), [n]) });
      const o = out.O!.data as Float32Array;
      for (let i = 0; i < rowsA; i++) {
        for (let j = 0; j < n; j++) {
          let d = 0;
          for (let k = 0; k < dim; k++) d += qa[i * dim + k]! * qb[j * dim + k]!;
          if (o[i * n + j] !== d * 2 ** -14) return false;
        }
      }
    }
    return true;
  } finally {
    await s.release();
  }
}

const probes = new Map<string, Promise<boolean>>();

/** {@link integerGemmIsExact}, run once per operand kind and dimension. */
export function integerGemmChecked(ort: Ort, signed: boolean, dim: number): Promise<boolean> {
  const key = `${signed}:${dim}`;
  let p = probes.get(key);
  if (!p) {
    p = integerGemmIsExact(ort, signed, dim);
    probes.set(key, p);
  }
  return p;
}

/** Candidates for the exact nearest row of the float32 table ``t`` (rows × dim). */
export class Int8CandidatePass {
  /** Candidate pairs after step 5, summed since construction. */
  lastPairs = 0;
  private readonly padded: number;
  private readonly n: Float64Array;
  private readonly twoTn: Float64Array;
  private readonly fnThat: Float64Array; // 2‖f_j‖ + 2 γ4 ‖t̂_j‖
  private readonly nMax: number;
  private readonly bMin: number;
  private readonly beta32: Float32Array;
  private readonly delta: Float64Array;
  private cand: Int32Array = new Int32Array(1024); // candidate rows of a chunk (grown when needed)

  private constructor(private readonly ort: Ort, private readonly session: import("onnxruntime-web").InferenceSession,
                      private readonly t: Float32Array, readonly rows: number, readonly dim: number,
                      norms: Float64Array, b: Float64Array, fnThat: Float64Array,
                      readonly signed: boolean, readonly cap: number) {
    this.padded = Math.ceil(rows / PAD) * PAD;
    this.n = norms;
    this.twoTn = norms.map((x) => 2 * Math.sqrt(x));
    this.fnThat = fnThat;
    let nMax = 0;
    let bMin = Infinity;
    for (let v = 0; v < rows; v++) {
      if (norms[v]! > nMax) nMax = norms[v]!;
      if (b[v]! < bMin) bMin = b[v]!;
    }
    this.nMax = nMax;
    this.bMin = bMin;
    this.beta32 = new Float32Array(this.padded).fill(PAD_BIAS);
    this.delta = new Float64Array(rows);
  }

  /**
   * The pass over ``t`` with row norms² ``norms`` (float64), or null where the integer kernel
   * is not exact here. u8 operands first (a u8 table's step is finer than an s8 table's under
   * the pair constraint, so there are fewer candidates), else s8.
   */
  static async create(t: Float32Array, rows: number, dim: number, norms: Float64Array,
                      threads = 1, cap = 256): Promise<Int8CandidatePass | null> {
    if (dim > MAX_DIM) return null;
    const ort = await loadOrt(threads);
    for (const signed of [false, true]) {
      const tp = now();
      const exact = await integerGemmChecked(ort, signed, dim);
      measure("int8-probe", tp);
      if (!exact) continue;
      const padded = Math.ceil(rows / PAD) * PAD;
      const b = new Float64Array(padded).fill(1);
      const qT = signed ? new Int8Array(dim * padded) : new Uint8Array(dim * padded).fill(128);
      const fnThat = new Float64Array(rows);
      const t0 = now();
      quantizeRows(t, rows, dim, signed, b, qT, padded, signed ? 0 : 128, fnThat);
      measure("quantize", t0);
      const bScale = Float32Array.from(b, (x) => -2 * x);
      const t1 = now();
      const s = await session(ort, model(qT, dim, padded, bScale));
      measure("int8-session", t1);
      return new Int8CandidatePass(ort, s, t, rows, dim, norms, b, fnThat, signed, cap);
    }
    return null;
  }

  /**
   * Steps 4–5 for a chunk: β (into beta32), δ = n − β (into delta); returns M and
   * max |β| + max R.
   */
  private chunkBias(eMax: number, yMax: number): { bigM: number; scale: number } {
    let bigM = -Infinity;
    let betaMax = 0;
    let bigMax = 0;
    for (let j = 0; j < this.rows; j++) {
      const spread = eMax * this.twoTn[j]! + yMax * this.fnThat[j]!;
      const n = this.n[j]!;
      const beta = Math.fround(n - spread - GAMMA4 * n);
      this.beta32[j] = beta;
      const big = spread + GAMMA4 * Math.abs(beta);
      const delta = n - beta;
      this.delta[j] = delta;
      if (big - delta > bigM) bigM = big - delta;
      if (Math.abs(beta) > betaMax) betaMax = Math.abs(beta);
      if (big > bigMax) bigMax = big;
    }
    return { bigM, scale: betaMax + bigMax };
  }

  /** Step 3 for a chunk of queries: one scale a (a float32) for the chunk, the operands
   * round(y / a) + 128, and per query ‖e‖ (e = y − a·q) and ‖ŷ‖ = a‖q‖; null where a · b_j could
   * underflow in the kernel (the float32 pass takes the chunk). */
  private quantizeQueries(y: Float64Array, m: number): { ops: Uint8Array; en: Float64Array; yn: Float64Array;
                                                          eMax: number; yMax: number; a: number } | null {
    const dim = this.dim;
    let top = 0;
    for (let i = 0; i < m * dim; i++) top = Math.max(top, Math.abs(y[i]!));
    const a = top > 0 ? f32Up(top / 127) : 1;
    if (a * this.bMin < TINY) return null;
    const ops = new Uint8Array(m * dim);
    const en = new Float64Array(m);
    const yn = new Float64Array(m);
    let eMax = 0;
    let yMax = 0;
    for (let i = 0; i < m; i++) {
      let ee = 0;
      let qq = 0;
      for (let k = i * dim; k < (i + 1) * dim; k++) {
        const q = Math.round(y[k]! / a); // |y / a| <= 127; any rounding: only e enters the bound
        const e = y[k]! - q * a;
        ops[k] = q + 128;
        ee += e * e;
        qq += q * q;
      }
      en[i] = Math.sqrt(ee);
      yn[i] = a * Math.sqrt(qq);
      if (en[i]! > eMax) eMax = en[i]!;
      if (yn[i]! > yMax) yMax = yn[i]!;
    }
    return { ops, en, yn, eMax, yMax, a };
  }

  /**
   * Bounds on the squared distance from each query to its nearest row other than
   * ``exclude[i]`` (−1: none left out), from one integer GEMM and no search: every row's real
   * score n_j − 2 y·t_j lies within o_j + δ_j ± (r_j(y) + slack), the bounds of step 7 taken
   * over every row, so min_j of the lower (upper) ends plus ‖y‖² bounds the nearest distance
   * from below (above). NaN for both where the chunk cannot be quantized (the caller then
   * searches exactly). For the privacy floor's near-duplicate check: most rows are decided by
   * their bounds, and only the undecided ones need the exact search.
   */
  async nearestBounds(y: Float64Array, m: number, exclude: Int32Array | null,
                      lo2: Float64Array, hi2: Float64Array): Promise<void> {
    lo2.fill(NaN, 0, m);
    hi2.fill(NaN, 0, m);
    const qy = this.quantizeQueries(y, m);
    if (qy === null) return;
    const { ops, en, yn, a } = qy;
    const { scale } = this.chunkBias(qy.eMax, qy.yMax);
    const o = await this.run(ops, m, a);
    const rows = this.rows;
    const padded = this.padded;
    // the slack of step 7 is the same for every pair: taken out of the minima, then applied
    // with max |o| over the chunk and an upper bound of max r (a larger slack is still a bound)
    let oMax = 0;
    let tnMax = 0;
    let fnMax = 0;
    let betaMax = 0;
    for (let j = 0; j < rows; j++) {
      tnMax = Math.max(tnMax, this.twoTn[j]!);
      fnMax = Math.max(fnMax, this.fnThat[j]!);
      betaMax = Math.max(betaMax, Math.abs(this.beta32[j]!));
    }
    const dim = this.dim;
    const y2 = new Float64Array(m);
    for (let i = 0; i < m; i++) {
      const off = i * padded;
      const skip = exclude === null ? -1 : exclude[i]!;
      const e = en[i]!;
      const q = yn[i]!;
      let lo = Infinity;
      let hi = Infinity;
      for (let j = 0; j < rows; j++) {
        const oj = o[off + j]!;
        if (Math.abs(oj) > oMax) oMax = Math.abs(oj);
        if (j === skip) continue;
        const c = oj + this.delta[j]!;
        const r = e * this.twoTn[j]! + q * this.fnThat[j]! + GAMMA4 * Math.abs(this.beta32[j]!);
        if (c - r < lo) lo = c - r;
        if (c + r < hi) hi = c + r;
      }
      lo2[i] = lo;
      hi2[i] = hi;
      let s2 = 0;
      for (let k = i * dim; k < (i + 1) * dim; k++) s2 += y[k]! ** 2;
      y2[i] = s2;
    }
    const rMax = qy.eMax * tnMax + qy.yMax * fnMax + GAMMA4 * betaMax;
    const slack = SLACK * (oMax + rMax + 2 * this.nMax + 2 * scale);
    for (let i = 0; i < m; i++) {
      const lo = lo2[i]! - slack;
      const hi = hi2[i]! + slack;
      const eps = 1e-12 * (y2[i]! + Math.abs(lo) + Math.abs(hi)); // float64 rounding of the sums
      lo2[i] = Math.max(0, y2[i]! + lo - eps);
      hi2[i] = y2[i]! + hi + eps;
    }
  }

  /**
   * What the pass reads for a chunk of queries ``y`` (m × dim), m × rows: ``score`` o_ij + δ_j,
   * its stand-in for s_ij = ‖t_j‖² − 2 y_i·t_j, and ``bound`` r_j(y_i), step 4's proven bound on
   * |s_ij − score_ij| (tests hold it against measured errors); null where the chunk takes the
   * float32 pass. The same steps as {@link searchChunk}.
   */
  async scoreBounds(y: Float64Array, m: number): Promise<{ score: Float64Array; bound: Float64Array } | null> {
    const qy = this.quantizeQueries(y, m);
    if (qy === null) return null;
    this.chunkBias(qy.eMax, qy.yMax);
    const o = await this.run(qy.ops, m, qy.a);
    const rows = this.rows;
    const score = new Float64Array(m * rows);
    const bound = new Float64Array(m * rows);
    for (let i = 0; i < m; i++) {
      for (let j = 0; j < rows; j++) {
        score[i * rows + j] = o[i * this.padded + j]! + this.delta[j]!;
        bound[i * rows + j] = this.pairBound(qy.en[i]!, qy.yn[i]!, j);
      }
    }
    return { score, bound };
  }

  /** r_j(y) of step 4 for the query norms (‖e‖, ‖ŷ‖) and row j. */
  private pairBound(en: number, yn: number, j: number): number {
    return en * this.twoTn[j]! + yn * this.fnThat[j]! + GAMMA4 * Math.abs(this.beta32[j]!);
  }

  /**
   * Nearest rows of the float64 queries ``y`` (m × dim, one chunk) into ``out`` (−1 where the
   * query must take the float32 pass); returns how many were decided in float64. With
   * ``exclude``, query i never gets row ``exclude[i]``: its score is set to +∞ before the
   * threshold is drawn, so the bound of step 5 is the one of the table without that row.
   */
  async searchChunk(y: Float64Array, m: number, out: Int32Array, exclude: Int32Array | null = null): Promise<number> {
    const dim = this.dim;
    out.fill(-1, 0, m);
    const qy = this.quantizeQueries(y, m);
    if (qy === null) return 0;
    const { ops, en, yn, a } = qy;
    const { bigM, scale } = this.chunkBias(qy.eMax, qy.yMax);
    const o = await this.run(ops, m, a);
    const rows = this.rows;
    const padded = this.padded;

    // step 5: the threshold from the best-scoring row, rounded up to float32
    const first = new Int32Array(m + 1); // query i's candidates: cand[first[i] .. first[i + 1])
    let cand = this.cand;
    let nc = 0;
    let ocMax = 0;
    let rbMax = 0;
    for (let i = 0; i < m; i++) {
      first[i] = nc;
      const off = i * padded;
      if (exclude !== null && exclude[i]! >= 0) o[off + exclude[i]!] = Infinity;
      const k = argmin(o, off, off + rows) - off;
      if (!Number.isFinite(o[off + k]!)) continue; // no other row: the float32 pass says so
      const ok = o[off + k]!;
      const rk = this.pairBound(en[i]!, yn[i]!, k);
      const thr32 = nextUpF32(ok + this.delta[k]! + rk + bigM
        + SLACK * (Math.abs(ok) + rk + 2 * this.nMax + 2 * scale));
      const start = nc;
      for (let j = 0; j < rows; j++) {
        if (o[off + j]! <= thr32) {
          if (nc === cand.length) cand = this.grow();
          cand[nc++] = j;
        }
      }
      if (nc - start > this.cap) {
        nc = start; // the float32 pass takes this query
        continue;
      }
      this.lastPairs += nc - start;
      for (let n = start; n < nc; n++) {
        const j = cand[n]!;
        ocMax = Math.max(ocMax, Math.abs(o[off + j]!));
        rbMax = Math.max(rbMax, this.pairBound(en[i]!, yn[i]!, j));
      }
    }
    first[m] = nc;

    // step 7: each candidate's own bounds, then a near tie decided in float64
    const slack = SLACK * (ocMax + rbMax + 2 * this.nMax + 2 * scale);
    let reranked = 0;
    for (let i = 0; i < m; i++) {
      const c0 = first[i]!;
      const c1 = first[i + 1]!;
      if (c1 === c0) continue;
      if (c1 - c0 === 1) {
        out[i] = cand[c0]!;
        continue;
      }
      const off = i * padded;
      let bestHi = Infinity;
      for (let n = c0; n < c1; n++) {
        const j = cand[n]!;
        const hi = o[off + j]! + this.delta[j]! + this.pairBound(en[i]!, yn[i]!, j) + slack;
        if (hi < bestHi) bestHi = hi;
      }
      let left = 0;
      let only = -1;
      let bestD = Infinity;
      let best = -1;
      for (let n = c0; n < c1; n++) { // increasing rows: a strict < keeps the lowest row on a tie
        const j = cand[n]!;
        const lo = o[off + j]! + this.delta[j]! - this.pairBound(en[i]!, yn[i]!, j) - slack;
        if (lo > bestHi) continue;
        left++;
        only = j;
        const d = sqDist(y, i * dim, this.t, j * dim, dim);
        if (d < bestD) {
          bestD = d;
          best = j;
        }
      }
      out[i] = left === 1 ? only : best;
      if (left > 1) reranked++;
    }
    return reranked;
  }

  /** The integer GEMM of step 2 with the bias of step 5: the scores o (m × padded). */
  private async run(ops: Uint8Array, m: number, a: number): Promise<Float32Array> {
    const ort = this.ort;
    const res = await this.session.run({ A: new ort.Tensor("uint8", ops, [m, this.dim]),
      a_scale: new ort.Tensor("float32", Float32Array.of(a), []),
      bias: new ort.Tensor("float32", this.beta32, [this.padded]) });
    const o = res.O!;
    const data = o.data as Float32Array;
    o.dispose?.();
    return data;
  }

  private grow(): Int32Array {
    const c = new Int32Array(this.cand.length * 2);
    c.set(this.cand);
    this.cand = c;
    return c;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}
