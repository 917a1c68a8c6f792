/**
 * `toy-rr` (tests/toy_mechanism.py, the Python plugin): k-ary randomized response on word
 * pieces, written as a built-in mechanism of the web edge would be. The test that adds it
 * (tests/web_edge/test_ts_builtin_mechanism.py) copies this file into src/mechanisms/ and adds
 * one entry to src/mechanisms/registry.ts: nothing else of the library changes.
 *
 * Each token x is kept with probability p = e^ε / (e^ε + V − 1), else replaced by one of the
 * other V − 1 regular tokens, uniformly (Kairouz, Oh, Viswanath 2014). Draws in numpy's order
 * (`rng.random(n)`, then `rng.integers(0, V − 1, n)` and `rng.integers(0, V, n)`), so a seeded
 * run sends what the Python edge sends.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import { WeakPrivacyError } from "../errors.js";
import { THRESHOLD } from "../floor/floor.js";
import { fmtG } from "../format/messages.js";
import { epsilonGuarantee, type EpsilonGuarantee } from "../ledger/accounting.js";
import { familyOf, type Cost } from "../ledger/ledger.js";
import { resolveSource, type BitSource } from "../random/random.js";
import { boundedUint32, positive } from "../random/samplers.js";
import { int32Bytes } from "../service/payload.js";
import type { BoundMechanism, BuildOptions, MechanismModule, Params, PrivatizedData } from "./module.js";
import { TokenBatch, nTokens, tokenPayloads, type TokenizedText } from "./tokens.js";

const NAME = "toy-rr";

class ToyRR implements BoundMechanism {
  readonly name = NAME;
  readonly needsWords = false;
  readonly sampler = this;
  private readonly regular: Int32Array;

  readonly floor: Promise<string | null>;

  constructor(readonly bundle: EdgeBundle, readonly epsilon: number, weak: string | null) {
    this.regular = Int32Array.from(bundle.regularIds).sort();
    this.floor = Promise.resolve(weak);
  }

  get params(): Params {
    return { epsilon: this.epsilon };
  }

  /** e^ε / (e^ε + V − 1), as a logistic function */
  keepProbability(): number {
    return 1 / (1 + (this.regular.length - 1) * Math.exp(-this.epsilon));
  }

  cost(item: TokenizedText): Cost {
    const n = nTokens(item);
    return { family: familyOf(NAME), epsilon: this.epsilon * n, metric: 0, tokens: n, sends: 1, eta: null };
  }

  guarantee(): EpsilonGuarantee {
    return epsilonGuarantee(NAME, this.params, this.epsilon, this.epsilon);
  }

  async privatize(items: readonly TokenizedText[], source?: BitSource | null): Promise<Int32Array> {
    const ids = new TokenBatch(items).flat;
    const src = resolveSource(source);
    const v = this.regular.length;
    const n = ids.length;
    const p = this.keepProbability();
    const u = Array.from({ length: n }, () => src.nextDouble());
    const other = Array.from({ length: n }, () => boundedUint32(src, v - 2));
    const any = Array.from({ length: n }, () => boundedUint32(src, v - 1));
    const out = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      let lo = 0;
      let hi = v;  // searchsorted, left
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (this.regular[mid]! < ids[i]!) lo = mid + 1;
        else hi = mid;
      }
      const pos = Math.min(lo, v - 1);
      const regular = this.regular[pos] === ids[i];
      if (regular && u[i]! < p) out[i] = ids[i]!;
      else out[i] = this.regular[regular ? other[i]! + (other[i]! >= pos ? 1 : 0) : any[i]!]!;
    }
    return out;
  }

  payloads(items: readonly TokenizedText[], data: PrivatizedData): string[] {
    return tokenPayloads(NAME, this.params, this.bundle.bundleId, new TokenBatch(items),
      (start, length) => ({ dtype: "int32", shape: [length], bytes: int32Bytes(data.subarray(start, start + length)) }));
  }

  async release(): Promise<void> {}
}

export const toyRr: MechanismModule = {
  name: NAME,
  lengthLimit: (bundle: EdgeBundle) => bundle.maxLength,
  async build(bundle: EdgeBundle, params: Readonly<Params>, options: BuildOptions): Promise<ToyRR> {
    const epsilon = positive("epsilon", params.epsilon as number);
    const probe = new ToyRR(bundle, epsilon, null);
    const p = probe.keepProbability();
    const weak = p <= THRESHOLD ? null
      : `${NAME} epsilon=${fmtG(epsilon)} is weaker than the privacy floor: ${(100 * p).toFixed(2)}% of tokens come back unchanged`;
    if (weak !== null && !options.allowWeakPrivacy) throw new WeakPrivacyError(weak);
    return new ToyRR(bundle, epsilon, weak);
  },
};
