/**
 * What the two dχ mechanisms (Qu et al. 2021 §3.2) share once built on a bundle: parameters
 * {η} (and p under a token policy), the cost of a payload of n tokens (the metric total η·n,
 * worst case η·n·D: shared.ledger), the guarantee (η·d per token next to η·D,
 * shared.accounting), one payload per text with one entry per word piece, and the privacy floor
 * measured on the bundle (shared.floor).
 *
 * The privatize step receives the batch by text and segment ({@link TokenBatch}): its
 * concatenation is what the sampler draws for, in numpy's order. Under a token policy
 * (`public_p`, the bundle's public words: shared.policy, SanText+'s rule) the draws follow
 * shared.mechanisms.dchi's order: first one uniform double per public token of the batch, in
 * order (a public word is sent as it is when u >= p), then the dχ noise of the tokens
 * privatized, in order, as without a policy; a public word sent as it is costs nothing and
 * carries no guarantee (the ledger counts it apart).
 *
 * On a bundle this edge does not vouch for (issue 42), the floor's check also measures the text
 * floor (../floor/text_floor.ts) on the tokens outside the policy's public list, after the
 * table's floor passed.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import { keptPublic, type TokenPolicy } from "../bundle/policy.js";
import { checkDchiFloor } from "../floor/floor.js";
import { checkTextFloor, type TextFloorResult } from "../floor/text_floor.js";
import { message } from "../format/messages.js";
import { pyFloat } from "../format/pyjson.js";
import { guarantee, type Guarantee } from "../ledger/accounting.js";
import { dchiCost, type Cost } from "../ledger/ledger.js";
import { resolveSource, type BitSource } from "../random/random.js";
import type { MechanismName } from "../generated/spec.js";
import { measure, now } from "../timing.js";
import { DChiText } from "./dchi.js";
import type { BoundMechanism, BuildOptions, Params, PrivatizedData } from "./module.js";
import { TokenBatch, nTokens, publicCount, tokenPayloads, type PayloadArray, type TokenizedText } from "./tokens.js";

/** A dχ mechanism on one bundle at one η (and, under a token policy, one p). */
export abstract class DChiBound implements BoundMechanism {
  readonly needsWords = false;
  /** the probability that a public word is privatized anyway; null: no policy */
  readonly publicP: number | null;
  /** the bundle's token policy when public_p asks for one, else null */
  readonly policy: TokenPolicy | null;
  /** the privacy floor's check: null when it passes, the reason with allowWeakPrivacy */
  readonly floor: Promise<string | null>;
  /** an unverified bundle's text floor, once {@link floor} resolved */
  textFloor: TextFloorResult | null = null;

  constructor(readonly name: MechanismName, readonly bundle: EdgeBundle, readonly eta: number,
              readonly sampler: unknown, checks: Promise<DChiFloor>,
              policy: DChiPolicy = NO_POLICY) {
    this.publicP = policy.p;
    this.policy = policy.policy;
    this.floor = checks.then((c) => {
      this.textFloor = c.textFloor;
      return c.reason;
    });
    this.floor.catch(() => undefined);  // handled: the privatizer awaits it
  }

  /** {eta}, and public_p under a token policy: shared.mechanisms.dchi's payload params. */
  get params(): Params {
    return this.publicP === null ? { eta: this.eta } : { eta: this.eta, public_p: this.publicP };
  }

  /** η·n for a payload of n tokens, worst-case ε = η·n·D over the privatization table; under a
   * token policy n counts the tokens outside the public words, which are counted apart. */
  cost(item: TokenizedText): Cost {
    const pub = this.policy === null ? 0 : publicCount(item, this.policy);
    return dchiCost(this.name, this.eta, nTokens(item), this.bundle.diameter, pub);
  }

  guarantee(): Guarantee {
    const p = this.policy;
    return guarantee(this.name, this.eta, this.bundle.diameter, this.bundle.tableDim, this.bundle.tableName,
      p === null ? null : { ...p.describe(), p: this.publicP! });
  }

  async privatize(items: readonly TokenizedText[], source?: BitSource | null): Promise<PrivatizedData> {
    const batch = new TokenBatch(items);
    if (this.policy === null) return this.privatizeIds(batch.flat, source);
    // shared.mechanisms.dchi: the coins of the public words first, then the noise of the rest
    const src = resolveSource(source);
    const keep = keptPublic(batch.publicMask(this.policy), this.publicP!, src);
    const priv: number[] = [];
    for (let k = 0; k < keep.length; k++) if (!keep[k]) priv.push(k);
    const ids = Int32Array.from(priv, (k) => batch.flat[k]!);
    const out = priv.length ? await this.privatizeIds(ids, src) : null;
    return this.merge(batch.flat, Int32Array.from(priv), out);
  }

  /** The privatize step: word-piece ids (the batch's, or under a token policy those privatized,
   * in order) → one output per id. */
  protected abstract privatizeIds(ids: Int32Array, source?: BitSource | null): Promise<PrivatizedData>;

  /** The batch's output under a token policy: each token of ``ids`` sent as it is, but those at
   * ``priv``, which get ``out`` (the privatize step's output for them, in order; null: none). */
  protected abstract merge(ids: Int32Array, priv: Int32Array, out: PrivatizedData | null): PrivatizedData;

  /** The payload array of the word pieces [start, start + length) of ``data``. */
  protected abstract array(data: PrivatizedData, start: number, length: number): PayloadArray;

  payloads(items: readonly TokenizedText[], data: PrivatizedData): string[] {
    return tokenPayloads(this.name, this.params, this.bundle.bundleId, new TokenBatch(items),
      (start, length) => this.array(data, start, length));
  }

  abstract release(): Promise<void>;
}

/** A dχ mechanism's token policy: its p and the bundle's public words (both null: none). */
export interface DChiPolicy {
  p: number | null;
  policy: TokenPolicy | null;
}

const NO_POLICY: DChiPolicy = { p: null, policy: null };

/**
 * The token policy ``params`` ask of ``bundle`` (shared.mechanisms.dchi.policy_of): none without
 * public_p; a RangeError for a p outside [0, 1], or, in shared.messages' words, for a bundle
 * without a policy (a policy is part of the bundle: cloud-api export-bundle --policy).
 */
export function dchiPolicy(name: string, bundle: EdgeBundle, params: Readonly<Params>): DChiPolicy {
  const p = params.public_p;
  if (p === undefined || p === null) return NO_POLICY;
  if (typeof p !== "number" || !(p >= 0 && p <= 1)) {
    // Python's repr of the float edge-agent reads
    const repr = typeof p !== "number" ? JSON.stringify(p) : Number.isFinite(p) ? pyFloat(p)
      : Number.isNaN(p) ? "nan" : p > 0 ? "inf" : "-inf";
    throw new RangeError(message("POLICY_P_RANGE", { public_p: repr }));
  }
  if (bundle.policy === null) {
    throw new RangeError(message("POLICY_NEEDED", { mechanism: name,
      why: message("POLICY_NONE_IN_BUNDLE", { bundle_id12: bundle.bundleId.slice(0, 12) }) }));
  }
  return { p, policy: bundle.policy };
}

/** What a dχ mechanism's floors found: why it is weaker than them (null: it passes), and an
 * unverified bundle's text floor (null: not measured). */
export interface DChiFloor {
  reason: string | null;
  textFloor: TextFloorResult | null;
}

/**
 * dχ at ``eta`` against the privacy floor of ``bundle``, measured on its table at every build
 * (shared.floor: nothing cached), then, on a bundle this edge does not vouch for
 * (``options.textFloor``), against the text floor (shared.floor_text): the reason is null when
 * both pass, else the first failure's with ``allowWeakPrivacy``, else WeakPrivacyError.
 * ``text``: the dchi-text sampler at ``eta`` on the bundle, or null to build one for the checks.
 * ``policy``: the token policy applied (both floors judge the tokens outside its public list).
 * The promise is handled here (a caller that never awaits it leaves no unhandled rejection):
 * await it before anything leaves the device.
 */
export function dchiFloor(name: MechanismName, eta: number, bundle: EdgeBundle, text: DChiText | null,
                          options: BuildOptions, policy: TokenPolicy | null = null): Promise<DChiFloor> {
  const check = (async (): Promise<DChiFloor> => {
    const t0 = now();
    const reason = await checkDchiFloor(name, eta, bundle, text, {
      source: options.floorSource, allowWeak: options.allowWeakPrivacy, search: options.search, policy });
    measure("floor", t0);
    const vouch = options.textFloor ?? null;
    if (vouch === null) return { reason, textFloor: null };
    // an unverified bundle: the text floor too (issue 42), on a sampler of its own for dchi-embedding
    const own = text === null ? await DChiText.create(bundle, eta, options.search) : null;
    try {
      const textFloor = await checkTextFloor((text ?? own)!, vouch.tokenizer, {
        source: options.floorSource, cache: vouch.cache, trustHow: vouch.trustHow,
        allowWeak: options.allowWeakPrivacy, policy });
      return { reason: reason ?? textFloor.reason, textFloor };
    } finally {
      await own?.release();
    }
  })();
  check.catch(() => undefined);
  return check;
}
