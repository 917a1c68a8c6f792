/**
 * What the two dχ mechanisms (Qu et al. 2021 §3.2) share once built on a bundle: parameters
 * {η}, the cost of a payload of n tokens (the metric total η·n, worst case η·n·D: shared.ledger),
 * the guarantee (η·d per token next to η·D, shared.accounting), one payload per text with one
 * entry per word piece, and the privacy floor measured on the bundle (shared.floor).
 *
 * The privatize step receives the batch by text and segment ({@link TokenBatch}): its
 * concatenation is what the sampler draws for, in numpy's order.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import { checkDchiFloor } from "../floor/floor.js";
import { guarantee, type Guarantee } from "../ledger/accounting.js";
import { dchiCost, type Cost } from "../ledger/ledger.js";
import type { BitSource } from "../random/random.js";
import type { MechanismName } from "../generated/spec.js";
import { measure, now } from "../timing.js";
import type { DChiText } from "./dchi.js";
import type { BoundMechanism, BuildOptions, PrivatizedData } from "./module.js";
import { TokenBatch, nTokens, tokenPayloads, type PayloadArray, type TokenizedText } from "./tokens.js";

/** A dχ mechanism on one bundle at one η. */
export abstract class DChiBound implements BoundMechanism {
  readonly needsWords = false;

  constructor(readonly name: MechanismName, readonly bundle: EdgeBundle, readonly eta: number,
              readonly sampler: unknown, readonly floor: Promise<string | null>) {}

  get params(): { eta: number } {
    return { eta: this.eta };
  }

  /** η·n for a payload of n tokens, worst-case ε = η·n·D over the privatization table. */
  cost(item: TokenizedText): Cost {
    return dchiCost(this.name, this.eta, nTokens(item), this.bundle.diameter);
  }

  guarantee(): Guarantee {
    return guarantee(this.name, this.eta, this.bundle.diameter, this.bundle.tableDim, this.bundle.tableName);
  }

  privatize(items: readonly TokenizedText[], source?: BitSource | null): Promise<PrivatizedData> {
    return this.privatizeBatch(new TokenBatch(items), source);
  }

  /** The privatize step: the batch's word pieces (by text and segment, and concatenated) → one
   * output per word piece, in the concatenation's order. */
  protected abstract privatizeBatch(batch: TokenBatch, source?: BitSource | null): Promise<PrivatizedData>;

  /** The payload array of the word pieces [start, start + length) of ``data``. */
  protected abstract array(data: PrivatizedData, start: number, length: number): PayloadArray;

  payloads(items: readonly TokenizedText[], data: PrivatizedData): string[] {
    return tokenPayloads(this.name, this.params, this.bundle.bundleId, new TokenBatch(items),
      (start, length) => this.array(data, start, length));
  }

  abstract release(): Promise<void>;
}

/** RangeError for a token policy's parameter (shared.policy: public_p), which this edge does
 * not apply yet: a payload must never claim a policy it was not made under. */
export function refusePolicy(params: Readonly<Record<string, number | string | null>>): void {
  const p = params.public_p;
  if (p !== undefined && p !== null) {
    throw new RangeError("public_p: this web edge does not apply token policies yet; privatize with edge-agent (the Python edge), or use a model without one");
  }
}

/**
 * dχ at ``eta`` against the privacy floor of ``bundle``, measured on its table at every build
 * (shared.floor: nothing cached): null when it passes, the reason with ``allowWeakPrivacy``,
 * else WeakPrivacyError. ``text``: the dchi-text sampler at ``eta`` on the bundle, or null to
 * build one for the check. The promise is handled here (a caller that never awaits it leaves
 * no unhandled rejection): await it before anything leaves the device.
 */
export function dchiFloor(name: MechanismName, eta: number, bundle: EdgeBundle, text: DChiText | null,
                          options: BuildOptions): Promise<string | null> {
  const t0 = now();
  const check = checkDchiFloor(name, eta, bundle, text, {
    source: options.floorSource, allowWeak: options.allowWeakPrivacy, search: options.search });
  check.then(() => measure("floor", t0), () => undefined);
  return check;
}
