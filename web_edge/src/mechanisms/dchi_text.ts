/**
 * `dchi-text`: text-to-text dχ-privacy (Qu et al. 2021 §3.2.4, after Feyisetan et al. 2020):
 * each word piece x becomes the exact nearest regular token to φ(x) + N over the bundle's
 * privatization table (nearest neighbour is post-processing: the guarantee is dχ's). The
 * payload is the privatized token ids, int32.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import type { BitSource } from "../random/random.js";
import { positive } from "../random/samplers.js";
import { int32Bytes } from "../service/payload.js";
import { measure, now } from "../timing.js";
import { DChiText } from "./dchi.js";
import { DChiBound, dchiFloor, dchiPolicy } from "./dchi_bound.js";
import type { BuildOptions, MechanismModule, Params, PrivatizedData } from "./module.js";
import type { PayloadArray } from "./tokens.js";

const NAME = "dchi-text";

class DChiTextBound extends DChiBound {
  declare readonly sampler: DChiText;

  protected privatizeIds(ids: Int32Array, source?: BitSource | null): Promise<Int32Array> {
    return this.sampler.privatizeIds(ids, source);
  }

  /** A public word sent as it is: its own id. */
  protected merge(ids: Int32Array, priv: Int32Array, out: PrivatizedData | null): Int32Array {
    const data = Int32Array.from(ids);
    priv.forEach((k, j) => { data[k] = out![j]!; });
    return data;
  }

  protected array(data: PrivatizedData, start: number, length: number): PayloadArray {
    return { dtype: "int32", shape: [length], bytes: int32Bytes(data.subarray(start, start + length)) };
  }

  async release(): Promise<void> {
    await this.sampler.release();
  }
}

export const dchiText: MechanismModule = {
  name: NAME,
  lengthLimit: (bundle: EdgeBundle) => bundle.maxLength,
  async build(bundle: EdgeBundle, params: Readonly<Params>, options: BuildOptions): Promise<DChiTextBound> {
    const eta = params.eta as number;
    positive("eta", eta);
    const policy = dchiPolicy(NAME, bundle, params);
    const t0 = now();
    const text = await DChiText.create(bundle, eta, options.search);
    measure("search", t0);
    return new DChiTextBound(NAME, bundle, eta, text, dchiFloor(NAME, eta, bundle, text, options, policy.policy),
                             policy);
  },
};
