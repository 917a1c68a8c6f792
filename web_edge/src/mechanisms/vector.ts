/**
 * The sentence-vector mechanisms through the bundle's frozen encoder (`encoder.onnx`, run by
 * onnxruntime-web), as edge_agent/privatize/privatizer.py and
 * shared/mechanisms/{laplace,binary}.py:
 *
 * - `laplace` (DPNR, Lyu, He, Li 2020 §3.3): the vector min-max scaled to [0, 1] plus i.i.d.
 *   Laplace(0, b) noise; b = r/ε ("vector": the whole vector is ε-DP) or 1/ε ("coordinate", as
 *   published: r·ε for the vector). Optional word dropout μ before encoding (each word with all
 *   its word pieces; Theorem 2).
 * - `ome` (Lyu, Li, He, Xiao 2020, SIGIR §3.1, Algorithm 1): the vector z-scored, each value as
 *   1 sign + 4 integer + 5 fraction bits, every bit through randomized response with
 *   p_i = λ/(1+λ) (even i) or 1/(1+λ³) (odd i), q = 1/(1 + λe^(ε/(r·l))) (Eq. 2-3).
 *
 * The privacy floor and the costs are shared/floor.py's and shared/ledger.py's (worst-case ε).
 * Draw order is numpy's, so a seeded source draws what the Python edge draws; the encoder's
 * WebAssembly arithmetic differs from onnxruntime's native kernels in the last bits.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import { WeakPrivacyError } from "../errors.js";
import { THRESHOLD } from "../floor/floor.js";
import { COMPUTABLE, FLOOR, MECHANISMS } from "../generated/spec.js";
import { message, pct, weakHead } from "../format/messages.js";
import { loadOrt } from "../runtime/ort.js";
import type { BitSource } from "../random/random.js";
import { resolveSource } from "../random/random.js";
import { positive } from "../random/samplers.js";

const { F32_MAX, TAIL } = COMPUTABLE;
const LAPLACE_STEP: number = FLOOR.LAPLACE_STEP; // 2^-23: the float32 step at 1
/** OME's parameters its refusals name (those it takes as flags: not the bit layout) */
const OME_SPEC = MECHANISMS.find((m) => m.name === "ome")!;
const OME_NAMED = OME_SPEC.flags.map((f) => f.param);
/** OME's default bit layout (OMEParams' defaults): 1 sign + 4 integer + 5 fraction bits */
const OME_LAYOUT = OME_SPEC.params.properties;

function sigmoid(x: number): number {
  if (x >= 0) return 1 / (1 + Math.exp(-x));
  const e = Math.exp(x);
  return e / (1 + e);
}


/** A Laplace(0, scale) draw as numpy's random_laplace. */
export function laplaceDraw(src: BitSource, scale: number): number {
  for (;;) {
    const u = src.nextDouble();
    if (u >= 0.5) return 0 - scale * Math.log(2 - u - u);
    if (u > 0) return 0 + scale * Math.log(u + u);
  }
}

/** Worst-case ε of independent randomized response on bits (shared.accounting.bit_flip_epsilon). */
export function bitFlipEpsilon(p: Float64Array, q: number): number {
  if (!(q > 0 && q < 1) || p.some((x) => !(x > 0 && x < 1))) return Infinity;
  const lq = Math.log(q);
  const l1q = Math.log1p(-q);
  let s = 0;
  for (const x of p) s += Math.max(Math.abs(Math.log(x) - lq), Math.abs(Math.log1p(-x) - l1q));
  return s;
}

export class Laplace {
  readonly name = "laplace";
  readonly epsilon: number;
  readonly wordDropout: number;

  constructor(epsilon: number, readonly calibration: "vector" | "coordinate" = "vector", wordDropout = 0) {
    this.epsilon = positive("epsilon", epsilon);
    if (calibration !== "vector" && calibration !== "coordinate") {
      throw new RangeError(`calibration must be one of ('vector', 'coordinate'), got '${String(calibration)}'`);
    }
    if (typeof wordDropout !== "number" || !(wordDropout >= 0 && wordDropout < 1)) {
      throw new RangeError(`word_dropout must be in [0, 1), got ${String(wordDropout)}`);
    }
    this.wordDropout = wordDropout;
  }

  /** params in the payload's order, with their JSON kinds */
  get params(): { epsilon: number; calibration: string; word_dropout: number } {
    return { epsilon: this.epsilon, calibration: this.calibration, word_dropout: this.wordDropout };
  }

  scale(dim: number): number {
    return (this.calibration === "vector" ? dim : 1) / this.epsilon;
  }

  /** ε of the whole vector (shared.accounting.laplace_vector_epsilon). */
  vectorEpsilon(dim: number): number {
    return this.calibration === "vector" ? this.epsilon : dim * this.epsilon;
  }

  checkComputable(dim: number): void {
    const b = this.scale(dim);
    if (!Number.isFinite(b) || 1 + b * TAIL > F32_MAX / 4) {
      throw new RangeError(message("LAPLACE_TOO_SMALL", { epsilon: this.epsilon, scale: b }));
    }
  }

  weakReason(dim: number, threshold = THRESHOLD): string | null {
    const head = weakHead(message("LAPLACE_WHAT", { epsilon: this.epsilon }));
    if (!Number.isFinite(this.vectorEpsilon(dim))) return message("LAPLACE_NOT_FINITE", { head });
    const b = this.scale(dim);
    const within = b > 0 ? -Math.expm1(-LAPLACE_STEP / b) : 1;
    const p = within > 0 ? Math.exp(dim * Math.log(within)) : 0;
    if (p <= threshold) return null;
    return message("LAPLACE_ROUNDING", { head, scale: b, share: pct(p), floor: pct(threshold) });
  }

  /** Noisy scaled vectors (b × r, float64) of the encoder's vectors. */
  privatize(vecs: Float32Array, dim: number, source?: BitSource | null): Float64Array {
    const src = resolveSource(source);
    const b = this.scale(dim);
    const out = new Float64Array(vecs.length);
    for (let i = 0; i < vecs.length / dim; i++) {
      let lo = Infinity;
      let hi = -Infinity;
      for (let k = 0; k < dim; k++) {
        lo = Math.min(lo, vecs[i * dim + k]!);
        hi = Math.max(hi, vecs[i * dim + k]!);
      }
      const span = hi - lo;
      for (let k = 0; k < dim; k++) out[i * dim + k] = span > 0 ? (vecs[i * dim + k]! - lo) / span : 0;
    }
    for (let i = 0; i < out.length; i++) out[i] = out[i]! + laplaceDraw(src, b);
    return out;
  }
}

export class OME {
  readonly name = "ome";
  readonly epsilon: number;
  readonly lam: number;
  readonly bitsPerValue: number;
  readonly nBits: number;
  readonly maxAbs: number;

  constructor(epsilon: number, lam: number, readonly dim: number, readonly intBits: number = OME_LAYOUT.int_bits.default,
              readonly fracBits: number = OME_LAYOUT.frac_bits.default) {
    this.epsilon = positive("epsilon", epsilon);
    this.lam = positive("lam", lam);
    this.bitsPerValue = 1 + intBits + fracBits;
    this.nBits = dim * this.bitsPerValue;
    this.maxAbs = 2 ** intBits - 2 ** -fracBits;
  }

  get params(): { epsilon: number; lam: number; int_bits: number; frac_bits: number } {
    return { epsilon: this.epsilon, lam: this.lam, int_bits: this.intBits, frac_bits: this.fracBits };
  }

  /** (p for every bit position, q) of Eq. 2-3, as logistic functions of ln λ (no overflow). */
  bitProbabilities(): [Float64Array, number] {
    const ll = Math.log(this.lam);
    const even = sigmoid(ll);
    const odd = sigmoid(-3 * ll);
    const q = sigmoid(-(ll + this.epsilon / this.nBits));
    const p = new Float64Array(this.nBits);
    for (let i = 0; i < p.length; i++) p[i] = i % 2 === 0 ? even : odd;
    return [p, q];
  }

  /** Worst-case ε over all bits (what shared.ledger charges). */
  worstEpsilon(): number {
    const [p, q] = this.bitProbabilities();
    return bitFlipEpsilon(p, q);
  }

  weakReason(threshold = THRESHOLD): string | null {
    const [p, q] = this.bitProbabilities();
    const values: Record<string, number> = this.params;
    const params = OME_NAMED.map((name) => message("BITS_PARAM", { name, value: values[name]! }))
      .join(message("BITS_PARAM_JOIN"));
    const head = weakHead(message("BITS_WHAT", { mechanism: this.name, params }));
    if (!Number.isFinite(bitFlipEpsilon(p, q))) return message("BITS_NOT_FINITE", { head });
    const mq = Math.max(q, 1 - q);
    let logProb = 0;
    for (const x of p) logProb += Math.log(Math.min(Math.max(x, 1 - x), mq));
    const prob = Math.exp(logProb);
    if (prob <= threshold) return null;
    return message("BITS_FIXED", { head, share: pct(prob), n_bits: this.nBits, floor: pct(threshold) });
  }

  /** z-score, clip, fixed-point bits (b × n_bits, 0/1). */
  encode(vecs: Float32Array): Uint8Array {
    const n = this.dim;
    const rows = vecs.length / n;
    const out = new Uint8Array(rows * this.nBits);
    const mag = this.intBits + this.fracBits;
    for (let i = 0; i < rows; i++) {
      let mean = 0;
      for (let k = 0; k < n; k++) mean += vecs[i * n + k]!;
      mean /= n;
      let v = 0;
      for (let k = 0; k < n; k++) v += (vecs[i * n + k]! - mean) ** 2;
      const sd = Math.sqrt(v / n);
      for (let k = 0; k < n; k++) {
        const z = sd > 0 ? (vecs[i * n + k]! - mean) / sd : 0;
        const fixed = Math.floor(Math.min(Math.abs(z), this.maxAbs) * 2 ** this.fracBits);
        const o = i * this.nBits + k * this.bitsPerValue;
        out[o] = z < 0 ? 1 : 0;
        for (let j = 0; j < mag; j++) out[o + 1 + j] = Math.floor(fixed / 2 ** (mag - 1 - j)) % 2;
      }
    }
    return out;
  }

  /** Randomized response on every bit (one uniform draw per bit, in order). */
  perturb(bits: Uint8Array, source?: BitSource | null): Uint8Array {
    const src = resolveSource(source);
    const [p, q] = this.bitProbabilities();
    const out = new Uint8Array(bits.length);
    for (let i = 0; i < bits.length; i++) {
      const u = src.nextDouble();
      out[i] = (bits[i] === 1 ? u < p[i % this.nBits]! : u < q) ? 1 : 0;
    }
    return out;
  }
}

/** numpy.packbits (most significant bit first, zero padding). */
export function packBits(bits: Uint8Array): Uint8Array {
  const out = new Uint8Array(Math.ceil(bits.length / 8));
  for (let i = 0; i < bits.length; i++) if (bits[i]) out[i >> 3]! |= 0x80 >> (i & 7);
  return out;
}

/** The bundle's frozen sentence encoder (contract: input_ids, attention_mask, token_type_ids
 * int64 [batch, seq] right-padded with [PAD]; output sentence_embedding float32 [batch, r]). */
export class SentenceEncoder {
  private constructor(private readonly session: import("onnxruntime-web").InferenceSession,
                      private readonly ort: typeof import("onnxruntime-web"),
                      readonly padId: number, readonly outputDim: number,
                      readonly maxLength: number | null, readonly feeds: string[]) {}

  static async fromBundle(bundle: EdgeBundle, threads = 1): Promise<SentenceEncoder> {
    const desc = bundle.meta.encoder;
    if (bundle.encoderOnnx === null || !desc || typeof desc.output_dim !== "number") {
      throw new RangeError(`bundle ${bundle.bundleId.slice(0, 12)}… has no encoder.onnx; laplace, ome and texthide need a bundle with the frozen sentence encoder (made by \`cloud-api export-bundle\`, or fetched with --server)`);
    }
    const ort = await loadOrt(threads);
    const session = await ort.InferenceSession.create(bundle.encoderOnnx, { executionProviders: ["wasm"] });
    const need = ["input_ids", "attention_mask", "token_type_ids"];
    if (!need.filter((n) => n !== "token_type_ids").every((n) => session.inputNames.includes(n))
        || !session.outputNames.includes("sentence_embedding")) {
      throw new RangeError(`encoder.onnx does not follow the contract: inputs ${JSON.stringify(session.inputNames)}, outputs ${JSON.stringify(session.outputNames)}`);
    }
    return new SentenceEncoder(session, ort, bundle.meta.special_ids.pad!, desc.output_dim,
      typeof desc.max_length === "number" ? desc.max_length : null, need.filter((n) => session.inputNames.includes(n)));
  }

  /** Sentence vectors (b × r float32) of full input sequences ([CLS] … [SEP]). */
  async encode(seqs: number[][], types: number[][]): Promise<Float32Array> {
    const r = this.outputDim;
    const out = new Float32Array(seqs.length * r);
    const order = seqs.map((s, i) => [s.length, i] as const).sort((a, b) => a[0] - b[0] || a[1] - b[1]).map((x) => x[1]);
    for (let s0 = 0; s0 < order.length; s0 += 64) {
      const idx = order.slice(s0, s0 + 64);
      const width = Math.max(...idx.map((i) => seqs[i]!.length));
      const ids = new BigInt64Array(idx.length * width).fill(BigInt(this.padId));
      const mask = new BigInt64Array(idx.length * width);
      const tt = new BigInt64Array(idx.length * width);
      idx.forEach((i, row) => {
        seqs[i]!.forEach((v, k) => {
          ids[row * width + k] = BigInt(v);
          mask[row * width + k] = 1n;
          tt[row * width + k] = BigInt(types[i]![k]!);
        });
      });
      const dims = [idx.length, width];
      const all: Record<string, import("onnxruntime-web").Tensor> = {
        input_ids: new this.ort.Tensor("int64", ids, dims), attention_mask: new this.ort.Tensor("int64", mask, dims),
        token_type_ids: new this.ort.Tensor("int64", tt, dims),
      };
      const res = await this.session.run(Object.fromEntries(this.feeds.map((n) => [n, all[n]!])));
      const vec = res.sentence_embedding!;
      if (vec.dims.length !== 2 || vec.dims[0] !== idx.length || vec.dims[1] !== r) {
        throw new RangeError(`encoder.onnx returned shape [${vec.dims.join(", ")}] for a batch of ${idx.length}; expected (batch, ${r})`);
      }
      const data = vec.data as Float32Array;
      idx.forEach((i, row) => out.set(data.subarray(row * r, (row + 1) * r), i * r));
    }
    if (!out.every(Number.isFinite)) throw new RangeError("encoder.onnx returned NaN or Inf");
    return out;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}

/** Refuse (WeakPrivacyError) or return the floor reason of a vector mechanism. */
export function requireVectorFloor(mech: Laplace | OME, dim: number, allowWeak: boolean): string | null {
  const why = mech instanceof Laplace ? mech.weakReason(dim) : mech.weakReason();
  if (why !== null && !allowWeak) throw new WeakPrivacyError(why);
  return why;
}
