/**
 * Texts → privatized payloads, on the device (edge_agent/privatize/privatizer.py): the bundle's
 * tokenizer, the length policy, then the mechanism's module (./registry.ts) on the whole batch:
 * its privatize step, its payloads, its costs.
 *
 * Length policy (the Python edge's): at most ``max_length − 2`` word pieces for a text,
 * ``max_length − 3`` for a pair; "first" keeps the first ones (a pair trims its longer segment
 * first, the second on a tie), "error" refuses the text. A text without word pieces is refused
 * ({@link TextError} "empty"), or skipped by a caller that allows it (the CLI skips and counts
 * it, as edge-agent does).
 *
 * The bundle's trust (issue 42, ../bundle/trust.ts): known, trusted (``trustedBundles``) or
 * unverified; an unverified bundle's text floor (../floor/text_floor.ts) is measured by the
 * mechanism's module as part of its privacy floor ({@link Privatizer.floorChecked}).
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import type { TokenPolicy } from "../bundle/policy.js";
import { TextError } from "../errors.js";
import type { MechanismName } from "../generated/spec.js";
import type { AnyGuarantee } from "../ledger/accounting.js";
import type { Cost } from "../ledger/ledger.js";
import type { NearestOptions } from "../search/nearest.js";
import type { FloatDtype } from "../service/payload.js";
import type { BitSource } from "../random/random.js";
import { measure, now } from "../timing.js";
import { TextTokenizer } from "../bundle/tokenizer.js";
import { trust, vouched, type Trust } from "../bundle/trust.js";
import type { TextFloorResult } from "../floor/text_floor.js";
import type { TextFloorCache } from "../floor/text_floor_cache.js";
import type { BoundMechanism, Params, PrivatizedData } from "./module.js";
import { mechanismModule } from "./registry.js";
import { mechanismSpec, paramSchemas, usesEncoder } from "./specs.js";
import type { TokenizedText } from "./tokens.js";

export type { PrivatizedData };
/** A mechanism's name in the mechanism spec. */
export type Mechanism = MechanismName;

/** Lengths after removing tokens from the longer segment first (the second on a tie). */
export function trimPair(lenA: number, lenB: number, budget: number): [number, number] {
  const excess = lenA + lenB - budget;
  if (excess <= 0) return [lenA, lenB];
  const gap = Math.abs(lenA - lenB);
  if (excess <= gap) return lenA > lenB ? [lenA - excess, lenB] : [lenA, lenB - excess];
  const rest = excess - gap;
  const even = Math.min(lenA, lenB);
  return [even - Math.floor(rest / 2), even - Math.floor((rest + 1) / 2)];
}

export interface PrivatizerOptions extends NearestOptions {
  /** a mechanism the web edge implements; any other name gets create()'s RangeError (the
   * Python-only ones name the Python edge) */
  mechanism: string;
  /** the mechanism's parameters by their spec names (`word_dropout`), e.g. a served model's
   * `params`; each one not given here is read from the option of its camelCase name below,
   * else its default */
  params?: Readonly<Record<string, number | string>> | null;
  /** dχ: eta */
  eta?: number;
  /** epsilon (DPNR, OME) */
  epsilon?: number;
  /** DPNR: "vector" (default) or "coordinate" */
  calibration?: "vector" | "coordinate";
  /** dχ: a token policy's p, the probability that a public word of the bundle's list is
   * privatized anyway (default: none, every token privatized) */
  publicP?: number | null;
  /** DPNR: word dropout rate μ in [0, 1) */
  wordDropout?: number;
  /** OME: randomized-response factor λ */
  lam?: number;
  /** the model's length limit incl. [CLS]/[SEP] (default: the mechanism's on the bundle) */
  maxLength?: number | null;
  truncate?: "first" | "error";
  /** payloads of float rows (dχ on embeddings): float32 (default) or float16 */
  floatDtype?: FloatDtype;
  /** privatize even below the privacy floor (the output is then close to the raw text) */
  allowWeakPrivacy?: boolean;
  /** what the privacy floor's check draws from: OS entropy by default (at every check); a
   * seeded generator only for reproducible tests */
  floorSource?: BitSource | null;
  /** bundle ids trusted as they are, beside the bundles privbert knows (../bundle/trust.ts);
   * any other bundle is unverified and must pass the text floor too */
  trustedBundles?: readonly string[] | null;
  /** how the caller trusts a bundle, named by a text floor refusal (default "--trusted-bundles") */
  trustHow?: string;
  /** passed text floors kept between loads, signed by this device (../floor/text_floor_cache.ts) */
  textFloorCache?: TextFloorCache | null;
}

const camel = (name: string): string => name.replace(/_(\w)/g, (_, c: string) => c.toUpperCase());

/** ``options``' value of each of ``mechanism``'s parameters (spec order): ``params``' entry,
 * else the camelCase option, else the parameter's default. */
function optionParams(mechanism: string, options: PrivatizerOptions): Params {
  const schemas = paramSchemas(mechanism);
  const named = options as unknown as Readonly<Record<string, number | string | undefined>>;
  const out: Params = {};
  for (const p of mechanismSpec(mechanism).param_names) {
    const v = options.params?.[p] ?? named[camel(p)] ?? schemas[p]?.default;
    if (v !== undefined && v !== null) out[p] = v;  // an optional parameter not used: absent
  }
  return out;
}

/** Texts → payloads of one mechanism, parameters and bundle. */
export class Privatizer {
  /** known, trusted or unverified (../bundle/trust.ts) */
  readonly trust: Trust;

  /** Settles with the privacy floor's check: resolved when the parameters pass it (or with
   * ``allowWeakPrivacy``), rejected with WeakPrivacyError when they do not. */
  readonly floorChecked: Promise<void>;
  private floorReason: string | null = null;
  private floorPassed = false;

  private constructor(readonly bundle: EdgeBundle, private readonly bound: BoundMechanism,
                      readonly maxLength: number, readonly truncate: "first" | "error",
                      readonly tokenizer: TextTokenizer, vouch: Trust) {
    this.trust = vouch;
    this.floorChecked = bound.floor.then((why) => {
      this.floorReason = why;
      this.floorPassed = true;
    });
    this.floorChecked.catch(() => undefined);  // handled: the caller awaits it
  }

  /**
   * The privatizer for ``options``, its privacy floor checked: RangeError for invalid
   * parameters, WeakPrivacyError for parameters weaker than the privacy floor, or for an
   * unverified bundle weaker than the text floor (unless ``allowWeakPrivacy``), a RangeError
   * naming the Python edge for the mechanisms that stay there.
   */
  static async create(bundle: EdgeBundle, options: PrivatizerOptions): Promise<Privatizer> {
    const p = await Privatizer.open(bundle, options);
    try {
      await p.floorChecked;
    } catch (exc) {
      await p.release();
      throw exc;
    }
    return p;
  }

  /**
   * The privatizer for ``options`` as soon as it can privatize in this page, its privacy floor
   * still being measured ({@link floorChecked}): {@link privatizeData} works at once (its output
   * stays on the device), {@link payloads} waits for nothing and refuses until the floor has
   * passed. A page shows a first privatization sooner this way; what leaves the device waits
   * for the floor as before. The caller releases it (also when the floor refuses).
   */
  static async open(bundle: EdgeBundle, options: PrivatizerOptions): Promise<Privatizer> {
    const module = mechanismModule(options.mechanism);
    const truncate = options.truncate ?? "first";
    if (truncate !== "first" && truncate !== "error") throw new RangeError(`truncate must be one of first, error, got ${String(truncate)}`);
    const limit = module.lengthLimit(bundle);
    const maxLength = checkLength(options.maxLength ?? limit, limit);
    const vouch = trust(bundle.bundleId, new Set(options.trustedBundles ?? []));
    const t0 = now();
    const tokenizer = new TextTokenizer(bundle.tokenizerJson);
    measure("tokenizer", t0);
    const bound = await module.build(bundle, optionParams(module.name, options), {
      search: options, floatDtype: options.floatDtype ?? "float32",
      allowWeakPrivacy: options.allowWeakPrivacy ?? false, floorSource: options.floorSource ?? null,
      textFloor: vouched(vouch) ? null
        : { tokenizer, cache: options.textFloorCache ?? null, trustHow: options.trustHow ?? "--trusted-bundles" },
    });
    return new Privatizer(bundle, bound, maxLength, truncate, tokenizer, vouch);
  }

  get name(): MechanismName {
    return this.bound.name;
  }

  /** the mechanism's parameters, as its payloads carry them */
  get params(): Params {
    return this.bound.params;
  }

  /** the mechanism's sampler object (DChiText, Laplace, ...) */
  get mechanism(): unknown {
    return this.bound.sampler;
  }

  /** why the parameters are weaker than the floor or the text floor (only with
   * allowWeakPrivacy, once checked) */
  get weakPrivacy(): string | null {
    return this.floorReason;
  }

  /** an unverified bundle's text floor, once {@link floorChecked} settled (null: known or
   * trusted, or a mechanism that does not privatize to the bundle's tokens) */
  get textFloor(): TextFloorResult | null {
    return this.floorPassed ? this.bound.textFloor ?? null : null;
  }

  /** whether the payloads are sentence vectors of the bundle's encoder */
  get isVector(): boolean {
    return usesEncoder(this.name);
  }

  /** Word pieces allowed: max_length − 2 (single) or − 3 (pair). */
  budget(pair: boolean): number {
    return this.maxLength - (pair ? 3 : 2);
  }

  /**
   * Word pieces of each text (pair), after the length policy. A text without word pieces is
   * null with ``allowEmpty``, else a {@link TextError}.
   */
  tokenize(texts: string[], pairs: string[] | null = null, allowEmpty = false): (TokenizedText | null)[] {
    if (pairs !== null && pairs.length !== texts.length) {
      throw new RangeError(`pairs must have one entry per text (${texts.length}), got ${pairs.length}`);
    }
    const budget = this.budget(pairs !== null);
    const words = this.bound.needsWords;
    return texts.map((text, i) => {
      const ea = this.tokenizer.encodeWords(text);
      const eb = pairs === null ? null : this.tokenizer.encodeWords(pairs[i]!);
      let a = ea.ids;
      let b = eb === null ? null : eb.ids;
      if (a.length === 0 || (b !== null && b.length === 0)) {
        if (allowEmpty) return null;
        throw new TextError(i, "empty", "has no tokens" + (b !== null ? " in one of its two segments" : ""));
      }
      const n = a.length + (b?.length ?? 0);
      let cutA = false;
      let cutB = false;
      if (n > budget) {
        if (this.truncate === "error") {
          throw new TextError(i, "too_long", `has ${n} tokens; the model takes at most ${budget} `
            + `(the option truncate: "first" keeps the first ${budget})`);
        }
        const [la, lb] = b === null ? [budget, 0] : trimPair(a.length, b.length, budget);
        cutA = this.cuts(a, la);
        cutB = this.cuts(b, lb);
        a = a.slice(0, la);
        b = b === null ? null : b.slice(0, lb);
      }
      const out: TokenizedText = { idsA: a, idsB: b, nBefore: n };
      if (cutA) out.cutA = true;
      if (cutB) out.cutB = true;
      if (words) {
        out.wordsA = ea.words.slice(0, a.length);
        out.wordsB = eb === null ? null : eb.words.slice(0, b!.length);
      }
      return out;
    });
  }

  /** Whether keeping the first ``kept`` of ``ids`` cuts a word (the next is a "##" piece); only
   * a token policy asks (edge_agent's Privatizer._cut). */
  private cuts(ids: number[] | null, kept: number): boolean {
    const policy = this.bound.policy ?? null;
    if (policy === null || ids === null || kept >= ids.length) return false;
    return policy.continues(ids[kept]!);
  }

  /** The token policy the mechanism applies (its bundle's public words), or null. */
  get policy(): TokenPolicy | null {
    return this.bound.policy ?? null;
  }

  /** What the payload of a tokenized item costs (shared.ledger.cost). */
  cost(item: TokenizedText): Cost {
    return this.bound.cost(item);
  }

  /** The published and worst-case guarantee (shared.accounting.guarantee). */
  guarantee(): AnyGuarantee {
    return this.bound.guarantee();
  }

  /** The mechanism's output for tokenized items (one call for the batch: the module's
   * privatize step; e.g. dχ on text the privatized ids, a sentence-vector mechanism its noisy
   * vectors). */
  privatizeData(items: TokenizedText[], source?: BitSource | null): Promise<PrivatizedData> {
    return this.bound.privatize(items, source);
  }

  /** The payload JSON of each item around {@link privatizeData}'s output. */
  payloads(items: TokenizedText[], data: PrivatizedData): string[] {
    if (!this.floorPassed) {
      throw new Error("the privacy floor is still being checked (Privatizer.open): await privatizer.floorChecked "
        + "before making payloads");
    }
    return this.bound.payloads(items, data);
  }

  /** One payload JSON per text (``pairs[i]`` the second sentence of pair i); TextError for an
   * empty text or, with truncation "error", one over the limit. */
  async privatize(texts: string[], source?: BitSource | null, pairs: string[] | null = null): Promise<string[]> {
    const items = this.tokenize(texts, pairs) as TokenizedText[];
    return this.payloads(items, await this.privatizeData(items, source));
  }

  async release(): Promise<void> {
    await this.bound.release();
  }
}

function checkLength(maxLength: number, limit: number): number {
  if (!Number.isInteger(maxLength) || maxLength < 4 || maxLength > limit) {
    throw new RangeError(`max_length must be an integer in [4, ${limit}], got ${maxLength}`);
  }
  return maxLength;
}
