/**
 * dχ-privacy for token embeddings (Qu et al. 2021 §3.2, after Feyisetan et al. 2020), as
 * shared/mechanisms/dchi.py: `dchi-embedding` sends φ(x) + N, `dchi-text` the exact nearest
 * regular token to φ(x) + N (§3.2.4: post-processing, which keeps the guarantee).
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import { ExactNearest, scoresOverflow, type NearestOptions } from "../search/nearest.js";
import type { BitSource } from "../random/random.js";
import { positive, sampleDchiNoise } from "../random/samplers.js";
import { measure, now } from "../timing.js";
import { COMPUTABLE } from "../generated/spec.js";
import { message } from "../format/messages.js";

const { F32_MAX, F16_MAX } = COMPUTABLE;
/** noise tails bounded with probability 1 - e^-TAIL (shared.mechanisms.computable.TAIL) */
export const TAIL: number = COMPUTABLE.TAIL;

/** x with Pr[Gamma(n, 1) >= x] <= e^-tail (sub-gamma bound; Boucheron, Lugosi, Massart §2.4). */
export function gammaTail(n: number, tail = TAIL): number {
  return n + Math.sqrt(2 * n * tail) + tail;
}

/** RangeError if η's noise added to embeddings of norm up to ``tMax`` is not finite in
 * ``floatDtype`` (and, with ``search``, in the float32 scores of the nearest-token search):
 * shared.mechanisms.computable.check_dchi_eta, same message. */
export function checkDchiEta(eta: number, dim: number, tMax: number,
                             floatDtype: "float32" | "float16" = "float32", search = true): void {
  if (!Number.isFinite(tMax)) throw new RangeError(message("DCHI_TABLE_NOT_FINITE")); // no eta helps
  const r = gammaTail(dim) / eta;
  const top = floatDtype === "float16" ? F16_MAX : F32_MAX / 4;
  let bad = !Number.isFinite(r) || r + tMax > top;
  if (search && !bad) bad = scoresOverflow(r + tMax, tMax);
  if (bad) {
    const where = message(floatDtype === "float16" ? "WHERE_FLOAT16" : "WHERE_FLOAT32");
    throw new RangeError(message("DCHI_TOO_SMALL", { eta, norm: r, where }));
  }
}

/** Token representation privatization M(x) = φ(x) + N (Qu et al. §3.2.3). */
export class DChiEmbedding {
  readonly name = "dchi-embedding";
  readonly eta: number;

  constructor(eta: number) {
    this.eta = positive("eta", eta);
  }

  get params(): { eta: number } {
    return { eta: this.eta };
  }

  /** Perturb each row of ``embeddings`` (L × n float32): float64 noisy rows, L × n. */
  privatize(embeddings: Float32Array, dim: number, source?: BitSource | null): Float64Array {
    const count = embeddings.length / dim;
    const noise = sampleDchiNoise(count, dim, this.eta, source);
    for (let i = 0; i < noise.length; i++) {
      const v = embeddings[i]! + noise[i]!;
      if (!Number.isFinite(Math.fround(v))) {
        throw new RangeError(message("DCHI_NOISE_OVERFLOW", { eta: this.eta }));
      }
      noise[i] = v;
    }
    return noise;
  }
}

/** Text-to-text privatization: the exact nearest regular token to φ(x) + N (§3.2.4), over the
 * bundle's privatization table (the model's embeddings, or a designed table's dequantized
 * values: EdgeBundle.table). */
export class DChiText {
  readonly name = "dchi-text";

  private searches: Promise<unknown> = Promise.resolve();

  private constructor(readonly bundle: EdgeBundle, readonly eta: number,
                      readonly index: ExactNearest) {}

  /** The mechanism on ``bundle`` (builds the exact search over its regular tokens). */
  static async create(bundle: EdgeBundle, eta: number, options: NearestOptions = {}): Promise<DChiText> {
    positive("eta", eta);
    const t0 = now();
    checkDchiEta(eta, bundle.tableDim, bundle.maxNorm);
    const reg = bundle.regularIds;
    const table = bundle.regularTable;
    const norms = bundle.regularNorms2();
    measure("table", t0);
    const index = await ExactNearest.create(table, reg.length, bundle.tableDim, reg, { ...options, norms });
    return new DChiText(bundle, eta, index);
  }

  get params(): { eta: number } {
    return { eta: this.eta };
  }

  /** ids checked inside the vocabulary (RangeError names the first bad one). */
  checkIds(ids: ArrayLike<number>): void {
    const v = this.bundle.vocabSize;
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      if (!Number.isInteger(id) || id < 0 || id >= v) {
        throw new RangeError(`token id ${id} is outside the vocabulary [0, ${v})`);
      }
    }
  }

  /** φ(x) + N in float64 for each id: the input of the nearest-token step. */
  noisyEmbeddings(ids: ArrayLike<number>, source?: BitSource | null): Float64Array {
    this.checkIds(ids);
    const n = this.bundle.tableDim;
    const y = sampleDchiNoise(ids.length, n, this.eta, source);
    const emb = this.bundle.table;
    for (let i = 0; i < ids.length; i++) {
      const o = ids[i]! * n;
      for (let k = 0; k < n; k++) y[i * n + k] = emb[o + k]! + y[i * n + k]!;
    }
    return y;
  }

  /** Privatized ids, each one a regular token. The noise is drawn at the call; searches run
   * one after the other (the privacy floor's measurement may run beside a page's first
   * privatization, and an onnxruntime-web session takes one run at a time). */
  async privatizeIds(ids: ArrayLike<number>, source?: BitSource | null): Promise<Int32Array> {
    const y = this.noisyEmbeddings(ids, source);  // before the first await: drawn at the call
    if (ids.length === 0) return new Int32Array(0);
    const run = this.searches.then(() => this.index.search(y));
    this.searches = run.catch(() => undefined);
    return run;
  }

  async release(): Promise<void> {
    await this.index.release();
  }
}
