/**
 * What one mechanism module gives the web edge (transformers.js's lesson: one file per family,
 * one name → module map, ./registry.ts). A module is keyed by its name in the mechanism spec and
 * holds everything of its mechanism the edge does by hand: how it is built on a bundle (its
 * parameters checked, its privacy floor), its privatize step, its payload encoding, its cost and
 * its guarantee. What both edges must agree on (parameters, payload field, family, refusals)
 * it reads from the spec.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import type { TokenPolicy } from "../bundle/policy.js";
import type { TextTokenizer } from "../bundle/tokenizer.js";
import type { TextFloorCache } from "../floor/text_floor_cache.js";
import type { TextFloorResult } from "../floor/text_floor.js";
import type { MechanismName } from "../generated/spec.js";
import type { AnyGuarantee } from "../ledger/accounting.js";
import type { Cost } from "../ledger/ledger.js";
import type { BitSource } from "../random/random.js";
import type { NearestOptions } from "../search/nearest.js";
import type { FloatDtype } from "../service/payload.js";
import type { TokenizedText } from "./tokens.js";

/** A mechanism's parameters by their spec names (`word_dropout`), in the payload's order. */
export type Params = Record<string, number | string>;

/** A privatize step's output for a batch: token ids, float64 rows, or bits (0/1). */
export type PrivatizedData = Int32Array | Float64Array | Uint8Array;

/** How a module builds its mechanism, besides the parameters. */
export interface BuildOptions {
  /** the exact nearest-token search's options (its candidate pass), and the WebAssembly
   * threads of onnxruntime-web (the search's, the encoder's) */
  search: NearestOptions;
  /** a payload of float rows: float32 or float16 (where the mechanism has the option) */
  floatDtype: FloatDtype;
  /** build it even below the privacy floor (its reason is then `weakPrivacy`) */
  allowWeakPrivacy: boolean;
  /** what a measured floor draws from: OS entropy unless a seeded generator (tests only) */
  floorSource: BitSource | null;
  /** the bundle is unverified (issue 42, ../bundle/trust.ts): a mechanism that privatizes to
   * the bundle's tokens (dχ) also measures the text floor (../floor/text_floor.ts) as part of
   * its privacy floor; null for a known or trusted bundle */
  textFloor?: TextFloorCheck | null;
}

/** What an unverified bundle's text floor needs besides the mechanism. */
export interface TextFloorCheck {
  /** the bundle's tokenizer (the public sample is tokenized by it) */
  tokenizer: TextTokenizer;
  /** passed text floors kept between loads, signed by this device */
  cache: TextFloorCache | null;
  /** how the caller trusts a bundle, named by a refusal ("--trusted-bundles", "the trustedBundles option") */
  trustHow: string;
}

/** One mechanism of the web edge. */
export interface MechanismModule {
  /** its name in the mechanism spec */
  readonly name: MechanismName;
  /** the longest input it privatizes on ``bundle``, word pieces with [CLS]/[SEP] (the
   * bundle's; a sentence encoder's own limit within it) */
  lengthLimit(bundle: EdgeBundle): number;
  /**
   * The mechanism at ``params`` on ``bundle``: RangeError for parameters that are invalid or
   * too small to compute. Its privacy floor (shared/floor.py's rule and message) is checked
   * from here on: the bound mechanism's {@link BoundMechanism.floor} settles with it.
   */
  build(bundle: EdgeBundle, params: Readonly<Params>, options: BuildOptions): Promise<BoundMechanism>;
}

/** A mechanism built on one bundle at fixed parameters: texts' word pieces → payloads. */
export interface BoundMechanism {
  readonly name: MechanismName;
  /** its parameters as its payloads carry them */
  readonly params: Params;
  /** the sampler object (DChiText, Laplace, ...): for callers that drive it directly */
  readonly sampler: unknown;
  /** the privacy floor's check, started by build: null when the parameters pass it, the
   * reason with ``allowWeakPrivacy``, else a rejection with WeakPrivacyError */
  readonly floor: Promise<string | null>;
  /** an unverified bundle's text floor, once {@link floor} resolved (absent or null: not
   * measured: a vouched bundle, or a mechanism that does not privatize to the bundle's tokens) */
  readonly textFloor?: TextFloorResult | null;
  /** whether it needs each word piece's word (TokenizedText's wordsA/wordsB: word dropout) */
  readonly needsWords: boolean;
  /** the token policy it applies (its bundle's public words), if any: the privatizer then marks
   * a text whose truncation cut a word (TokenizedText's cutA/cutB) */
  readonly policy?: TokenPolicy | null;
  /** the cost of one item's payload (shared.ledger.cost) */
  cost(item: TokenizedText): Cost;
  /** the privatize step for a batch (one call: numpy's draw order) */
  privatize(items: readonly TokenizedText[], source?: BitSource | null): Promise<PrivatizedData>;
  /** each item's payload JSON around {@link privatize}'s output */
  payloads(items: readonly TokenizedText[], data: PrivatizedData): string[];
  /** the published and the worst-case guarantee (shared.accounting.guarantee) */
  guarantee(): AnyGuarantee;
  release(): Promise<void>;
}
