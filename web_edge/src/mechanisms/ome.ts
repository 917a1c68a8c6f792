/**
 * `ome`: the optimized multiple encoding of Lyu, Li, He, Xiao 2020 (SIGIR §3.1, Algorithm 1),
 * as shared/mechanisms/binary.py: the sentence vector z-scored, each value as 1 sign + 4
 * integer + 5 fraction bits, every bit through randomized response with p_i = λ/(1+λ) (even i)
 * or 1/(1+λ³) (odd i), q = 1/(1 + λe^(ε/(r·l))) (Eq. 2-3). The payload is the bits, packed as
 * numpy.packbits. The ledger charges the worst case over all bits (shared.accounting), not the
 * published ε.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import { WeakPrivacyError } from "../errors.js";
import { THRESHOLD } from "../floor/floor.js";
import { message, pct, weakHead } from "../format/messages.js";
import { resolveSource, type BitSource } from "../random/random.js";
import { positive } from "../random/samplers.js";
import type { PayloadArray } from "../service/payload.js";
import { EncoderBound, encoderLengthLimit, withEncoder } from "./encoder.js";
import type { BuildOptions, MechanismModule, Params, PrivatizedData } from "./module.js";
import { mechanismSpec, paramSchemas } from "./specs.js";

const NAME = "ome";
/** OME's parameters its refusals name (those it takes as flags: not the bit layout) */
const OME_NAMED = mechanismSpec(NAME).flags.map((f) => f.param);
/** OME's default bit layout (OMEParams' defaults): 1 sign + 4 integer + 5 fraction bits */
const OME_LAYOUT = paramSchemas(NAME);

function sigmoid(x: number): number {
  if (x >= 0) return 1 / (1 + Math.exp(-x));
  const e = Math.exp(x);
  return e / (1 + e);
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

/** numpy.packbits (most significant bit first, zero padding). */
export function packBits(bits: Uint8Array): Uint8Array {
  const out = new Uint8Array(Math.ceil(bits.length / 8));
  for (let i = 0; i < bits.length; i++) if (bits[i]) out[i >> 3]! |= 0x80 >> (i & 7);
  return out;
}

export class OME {
  readonly name = NAME;
  readonly epsilon: number;
  readonly lam: number;
  readonly bitsPerValue: number;
  readonly nBits: number;
  readonly maxAbs: number;

  constructor(epsilon: number, lam: number, readonly dim: number,
              readonly intBits: number = OME_LAYOUT.int_bits!.default as number,
              readonly fracBits: number = OME_LAYOUT.frac_bits!.default as number) {
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

class OmeBound extends EncoderBound {
  declare readonly sampler: OME;

  worstEpsilon(): number {
    return this.sampler.worstEpsilon();
  }

  publishedEpsilon(): number {
    return this.sampler.epsilon;
  }

  protected perturb(vecs: Float32Array, src: BitSource): Uint8Array {
    return this.sampler.perturb(this.sampler.encode(vecs), src);
  }

  protected array(data: PrivatizedData, i: number): PayloadArray {
    const nb = this.sampler.nBits;
    return { dtype: "bits", shape: [nb], bytes: packBits((data as Uint8Array).subarray(i * nb, (i + 1) * nb)) };
  }
}

export const ome: MechanismModule = {
  name: NAME,
  lengthLimit: encoderLengthLimit,
  build: (bundle: EdgeBundle, params: Readonly<Params>, options: BuildOptions) =>
    withEncoder(bundle, options.search.threads, (encoder) => {
      const mech = new OME(params.epsilon as number, params.lam as number, encoder.outputDim,
        params.int_bits as number | undefined, params.frac_bits as number | undefined);
      const weak = mech.weakReason();
      if (weak !== null && !options.allowWeakPrivacy) throw new WeakPrivacyError(weak);
      return new OmeBound(NAME, bundle, encoder, mech, mech.params, weak);
    }),
};
