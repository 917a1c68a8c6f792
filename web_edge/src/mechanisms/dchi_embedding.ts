/**
 * `dchi-embedding`: dχ-privacy for token representations (Qu et al. 2021 §3.2.3): each word
 * piece's row of the model's own word embeddings plus N, sent as float32 (or float16) rows. It
 * needs the model's embeddings in the bundle (a designed privatization table serves dchi-text
 * only); its floor is measured as dchi-text's at the same η (whether the noisy row's nearest
 * regular token is the token).
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import type { BitSource } from "../random/random.js";
import { floatBytes, type FloatDtype } from "../service/payload.js";
import { DChiEmbedding, checkDchiEta } from "./dchi.js";
import { DChiBound, dchiFloor, dchiPolicy, type DChiFloor, type DChiPolicy } from "./dchi_bound.js";
import type { BuildOptions, MechanismModule, Params, PrivatizedData } from "./module.js";
import type { PayloadArray } from "./tokens.js";

const NAME = "dchi-embedding";

class DChiEmbeddingBound extends DChiBound {
  declare readonly sampler: DChiEmbedding;

  constructor(bundle: EdgeBundle, eta: number, sampler: DChiEmbedding, floor: Promise<DChiFloor>,
              readonly floatDtype: FloatDtype, policy: DChiPolicy) {
    super(NAME, bundle, eta, sampler, floor, policy);
  }

  protected privatizeIds(ids: Int32Array, source?: BitSource | null): Promise<Float64Array> {
    return Promise.resolve(this.sampler.privatize(this.bundle.rows(ids), this.bundle.dim, source));
  }

  /** A public word sent as it is: its row of the model's embeddings, unchanged. */
  protected merge(ids: Int32Array, priv: Int32Array, out: PrivatizedData | null): Float64Array {
    const n = this.bundle.dim;
    const data = Float64Array.from(this.bundle.rows(ids));
    priv.forEach((k, j) => data.set((out as Float64Array).subarray(j * n, (j + 1) * n), k * n));
    return data;
  }

  protected array(data: PrivatizedData, start: number, length: number): PayloadArray {
    const n = this.bundle.dim;
    return { dtype: this.floatDtype, shape: [length, n],
      bytes: floatBytes((data as Float64Array).subarray(start * n, (start + length) * n), this.floatDtype) };
  }

  async release(): Promise<void> {}
}

export const dchiEmbedding: MechanismModule = {
  name: NAME,
  lengthLimit: (bundle: EdgeBundle) => bundle.maxLength,
  async build(bundle: EdgeBundle, params: Readonly<Params>, options: BuildOptions): Promise<DChiEmbeddingBound> {
    const eta = params.eta as number;
    const sampler = new DChiEmbedding(eta);
    const policy = dchiPolicy(NAME, bundle, params);
    let tMax = 0;
    for (const x of bundle.embeddings) tMax = Math.max(tMax, Math.abs(x)); // BundleError: a designed table
    checkDchiEta(eta, bundle.dim, tMax, options.floatDtype, false);
    return new DChiEmbeddingBound(bundle, eta, sampler, dchiFloor(NAME, eta, bundle, null, options, policy.policy),
                                  options.floatDtype, policy);
  },
};
