/**
 * `laplace`: DPNR (Lyu, He, Li 2020 §3.3), as shared/mechanisms/laplace.py: the sentence
 * vector min-max scaled to [0, 1] plus i.i.d. Laplace(0, b) noise; b = r/ε ("vector": the
 * whole vector is ε-DP) or 1/ε ("coordinate", as published: r·ε for the vector). Optional word
 * dropout μ before encoding (each word with all its word pieces; Theorem 2: ε′ is published).
 * The payload is the noisy vector, float32 (r,). Its floor and cost are shared/floor.py's and
 * shared/ledger.py's.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import { WeakPrivacyError } from "../errors.js";
import { THRESHOLD } from "../floor/floor.js";
import { message, pct, weakHead } from "../format/messages.js";
import { COMPUTABLE, FLOOR } from "../generated/spec.js";
import { dropoutEpsilon } from "../ledger/accounting.js";
import { resolveSource, type BitSource } from "../random/random.js";
import { positive } from "../random/samplers.js";
import { floatBytes, type PayloadArray } from "../service/payload.js";
import { EncoderBound, encoderLengthLimit, withEncoder } from "./encoder.js";
import type { BuildOptions, MechanismModule, Params, PrivatizedData } from "./module.js";

const NAME = "laplace";
const { F32_MAX, TAIL } = COMPUTABLE;
const LAPLACE_STEP: number = FLOOR.LAPLACE_STEP; // 2^-23: the float32 step at 1

/** A Laplace(0, scale) draw as numpy's random_laplace. */
export function laplaceDraw(src: BitSource, scale: number): number {
  for (;;) {
    const u = src.nextDouble();
    if (u >= 0.5) return 0 - scale * Math.log(2 - u - u);
    if (u > 0) return 0 + scale * Math.log(u + u);
  }
}

export class Laplace {
  readonly name = NAME;
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

class LaplaceBound extends EncoderBound {
  declare readonly sampler: Laplace;

  override get wordDropout(): number {
    return this.sampler.wordDropout;
  }

  worstEpsilon(): number {
    return this.sampler.vectorEpsilon(this.encoder.outputDim);
  }

  publishedEpsilon(): number {
    const m = this.sampler;
    return m.wordDropout > 0 ? dropoutEpsilon(m.epsilon, m.wordDropout) : m.epsilon;
  }

  protected perturb(vecs: Float32Array, src: BitSource): Float64Array {
    return this.sampler.privatize(vecs, this.encoder.outputDim, src);
  }

  protected array(data: PrivatizedData, i: number): PayloadArray {
    const r = this.encoder.outputDim;
    return { dtype: "float32", shape: [r], bytes: floatBytes((data as Float64Array).subarray(i * r, (i + 1) * r), "float32") };
  }
}

export const laplace: MechanismModule = {
  name: NAME,
  lengthLimit: encoderLengthLimit,
  build: (bundle: EdgeBundle, params: Readonly<Params>, options: BuildOptions) =>
    withEncoder(bundle, options.search.threads, (encoder) => {
      const r = encoder.outputDim;
      const mech = new Laplace(params.epsilon as number, params.calibration as "vector" | "coordinate",
        params.word_dropout as number);
      mech.checkComputable(r);
      const weak = mech.weakReason(r);
      if (weak !== null && !options.allowWeakPrivacy) throw new WeakPrivacyError(weak);
      return new LaplaceBound(NAME, bundle, encoder, mech, mech.params, weak);
    }),
};
