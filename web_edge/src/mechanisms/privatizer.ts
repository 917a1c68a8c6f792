/**
 * Texts → privatized payloads, on the device (edge_agent/privatize/privatizer.py).
 *
 * Token kinds (`dchi-text`, `dchi-embedding`): word pieces of the bundle's tokenizer without
 * [CLS]/[SEP] (the server adds them), then the dχ mechanism on all tokens of a batch at once.
 * Vector kinds (`laplace`, `ome`): the bundle's frozen encoder on `[CLS] a [SEP] (b [SEP])`,
 * after DPNR word dropout (each word, with all its word pieces, removed with probability μ),
 * then the mechanism on the (b, r) vectors.
 *
 * Length policy (the Python edge's): at most ``max_length − 2`` word pieces for a text,
 * ``max_length − 3`` for a pair; "first" keeps the first ones (a pair trims its longer segment
 * first, the second on a tie), "error" refuses the text. A text without word pieces is refused
 * ({@link TextError} "empty"), or skipped by a caller that allows it (the CLI skips and counts
 * it, as edge-agent does).
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import { DChiEmbedding, DChiText, checkDchiEta } from "./dchi.js";
import { TextError } from "../errors.js";
import { checkDchiFloor } from "../floor/floor.js";
import { message } from "../format/messages.js";
import { dchiCost, vectorCost, type Cost } from "../ledger/ledger.js";
import type { NearestOptions } from "../search/nearest.js";
import {
  floatBytes, int32Bytes, tokenPayloadJson, vectorPayloadJson, type FloatDtype,
} from "../service/payload.js";
import { resolveSource, type BitSource } from "../random/random.js";
import { measure, now } from "../timing.js";
import { TextTokenizer } from "../bundle/tokenizer.js";
import { trust, vouched, type Trust } from "../bundle/trust.js";
import { checkTextFloor, type TextFloorResult } from "../floor/text_floor.js";
import type { TextFloorCache } from "../floor/text_floor_cache.js";
import { Laplace, OME, SentenceEncoder, packBits, requireVectorFloor } from "./vector.js";

export const MECHANISMS = ["dchi-text", "dchi-embedding", "laplace", "ome"] as const;
export type Mechanism = (typeof MECHANISMS)[number];
const PYTHON_ONLY: Record<string, string> = {
  texthide: "texthide stays in the Python edge (edge-agent): it has no differential-privacy "
    + "guarantee and needs a secret mask pool; use edge-agent privatize --mechanism texthide",
  none: `${message("NONE_REFUSED")}; the web edge does not send it`,
};

/** Word-piece ids of one text (or pair) after the length policy. */
export interface TokenizedText {
  idsA: number[];
  idsB: number[] | null;
  /** word pieces before truncation */
  nBefore: number;
  /** with word dropout: the word of each kept piece */
  wordsA?: number[];
  wordsB?: number[] | null;
}

export function nTokens(t: TokenizedText): number {
  return t.idsA.length + (t.idsB?.length ?? 0);
}

export function segments(t: TokenizedText): number[] | null {
  return t.idsB === null ? null : [t.idsA.length, t.idsB.length];
}

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
  /** a {@link Mechanism}; any other name gets create()'s RangeError (the Python-only ones
   * name the Python edge) */
  mechanism: string;
  /** dχ: eta */
  eta?: number;
  /** laplace, ome: epsilon */
  epsilon?: number;
  /** laplace: "vector" (default) or "coordinate" */
  calibration?: "vector" | "coordinate";
  /** laplace: DPNR word dropout rate μ in [0, 1) */
  wordDropout?: number;
  /** ome: randomized-response factor λ */
  lam?: number;
  /** the model's length limit incl. [CLS]/[SEP] (default: the bundle's) */
  maxLength?: number | null;
  truncate?: "first" | "error";
  /** dchi-embedding payloads: float32 (default) or float16 */
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

type Mech = DChiText | DChiEmbedding | Laplace | OME;
/** The mechanism's output: dchi-text ids, dchi-embedding or laplace float64 rows, ome bits. */
export type PrivatizedData = Int32Array | Float64Array | Uint8Array;

/** Texts → payloads of one mechanism, parameters and bundle. */
export class Privatizer {
  readonly tokenizer: TextTokenizer;
  private readonly diam: number;
  /** known, trusted or unverified (../bundle/trust.ts) */
  readonly trust: Trust;
  /** an unverified bundle's text floor (dχ), else null */
  readonly textFloor: TextFloorResult | null;

  private constructor(readonly bundle: EdgeBundle, readonly name: Mechanism, readonly mechanism: Mech,
                      readonly params: Record<string, number | string>, readonly maxLength: number,
                      readonly truncate: "first" | "error", readonly floatDtype: FloatDtype,
                      readonly encoder: SentenceEncoder | null,
                      /** why the parameters are weaker than the floor (only with allowWeakPrivacy) */
                      readonly weakPrivacy: string | null,
                      vouch: { trust: Trust; textFloor: TextFloorResult | null; tokenizer: TextTokenizer | null }) {
    const t0 = now();
    this.tokenizer = vouch.tokenizer ?? new TextTokenizer(bundle.tokenizerJson);
    measure("tokenizer", t0);
    this.trust = vouch.trust;
    this.textFloor = vouch.textFloor;
    this.diam = name.startsWith("dchi") ? bundle.diameter : 0; // shared.ledger.bundle_diameter: of the privatization table
  }

  /**
   * The privatizer for ``options``: RangeError for invalid parameters, WeakPrivacyError for
   * parameters weaker than the privacy floor (unless ``allowWeakPrivacy``), a RangeError naming
   * the Python edge for the mechanisms that stay there.
   */
  static async create(bundle: EdgeBundle, options: PrivatizerOptions): Promise<Privatizer> {
    const name = options.mechanism;
    if (name in PYTHON_ONLY) throw new RangeError(PYTHON_ONLY[name]);
    if (!(MECHANISMS as readonly string[]).includes(name)) {
      throw new RangeError(`no payload format for mechanism ${JSON.stringify(name)}; one of ${MECHANISMS.join(", ")}`);
    }
    const truncate = options.truncate ?? "first";
    if (truncate !== "first" && truncate !== "error") throw new RangeError(`truncate must be one of first, error, got ${String(truncate)}`);
    const floatDtype = options.floatDtype ?? "float32";
    const allowWeak = options.allowWeakPrivacy ?? false;
    const vouch = { trust: trust(bundle.bundleId, new Set(options.trustedBundles ?? [])),
      textFloor: null as TextFloorResult | null, tokenizer: null as TextTokenizer | null };
    if (name === "laplace" || name === "ome") {
      const encoder = await SentenceEncoder.fromBundle(bundle, options.threads ?? 1);
      try {
        const r = encoder.outputDim;
        const mech = name === "laplace"
          ? new Laplace(options.epsilon as number, options.calibration ?? "vector", options.wordDropout ?? 0)
          : new OME(options.epsilon as number, options.lam as number, r);
        if (mech instanceof Laplace) mech.checkComputable(r);
        const weak = requireVectorFloor(mech, r, allowWeak);
        const limit = Math.min(bundle.maxLength, encoder.maxLength ?? bundle.maxLength);
        const maxLength = checkLength(options.maxLength ?? limit, limit);
        return new Privatizer(bundle, name, mech, mech.params, maxLength, truncate, floatDtype, encoder, weak, vouch);
      } catch (exc) {
        await encoder.release();
        throw exc;
      }
    }
    const eta = options.eta as number;
    const maxLength = checkLength(options.maxLength ?? bundle.maxLength, bundle.maxLength);
    let mech: DChiText | DChiEmbedding;
    if (name === "dchi-text") {
      const t0 = now();
      mech = await DChiText.create(bundle, eta, options);
      measure("search", t0);
    } else {
      mech = new DChiEmbedding(eta);
      let tMax = 0;
      for (const x of bundle.embeddings) tMax = Math.max(tMax, Math.abs(x)); // BundleError: a designed table
      checkDchiEta(eta, bundle.dim, tMax, floatDtype, false);
    }
    try {
      const t0 = now();
      // the floor measures the output at every check (shared.floor): dchi-embedding by the
      // nearest-token guess of dchi-text at the same η, on a search built for the check
      const weak = await checkDchiFloor(name as "dchi-text" | "dchi-embedding", eta, bundle,
        mech instanceof DChiText ? mech : null, { source: options.floorSource ?? null, allowWeak, search: options });
      measure("floor", t0);
      if (!vouched(vouch.trust)) {
        // an unverified bundle: the text floor too (issue 42), on a search of its own for dchi-embedding
        const t1 = now();
        vouch.tokenizer = new TextTokenizer(bundle.tokenizerJson);
        measure("tokenizer", t1);
        const own = mech instanceof DChiText ? null : await DChiText.create(bundle, eta, options);
        try {
          vouch.textFloor = await checkTextFloor(mech instanceof DChiText ? mech : own!, vouch.tokenizer, {
            source: options.floorSource ?? null, cache: options.textFloorCache ?? null, trustHow: options.trustHow, allowWeak });
        } finally {
          await own?.release();
        }
      }
      return new Privatizer(bundle, name as Mechanism, mech, { eta }, maxLength, truncate, floatDtype, null,
        weak ?? vouch.textFloor?.reason ?? null, vouch);
    } catch (exc) {
      if (mech instanceof DChiText) await mech.release();
      throw exc;
    }
  }

  get isVector(): boolean {
    return this.encoder !== null;
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
    const words = this.mechanism instanceof Laplace && this.mechanism.wordDropout > 0;
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
      if (n > budget) {
        if (this.truncate === "error") {
          throw new TextError(i, "too_long", `has ${n} tokens; the model takes at most ${budget} `
            + `(truncation 'first' keeps the first ${budget})`);
        }
        if (b === null) a = a.slice(0, budget);
        else {
          const [la, lb] = trimPair(a.length, b.length, budget);
          a = a.slice(0, la);
          b = b.slice(0, lb);
        }
      }
      const out: TokenizedText = { idsA: a, idsB: b, nBefore: n };
      if (words) {
        out.wordsA = ea.words.slice(0, a.length);
        out.wordsB = eb === null ? null : eb.words.slice(0, b!.length);
      }
      return out;
    });
  }

  /** What the payload of a tokenized item costs (shared.ledger.cost). */
  cost(item: TokenizedText): Cost {
    const m = this.mechanism;
    if (m instanceof Laplace) return vectorCost("laplace", m.vectorEpsilon(this.encoder!.outputDim));
    if (m instanceof OME) return vectorCost("ome", m.worstEpsilon());
    return dchiCost(this.name, m.eta, nTokens(item), this.diam);
  }

  /** The mechanism's output for tokenized items (one call for the batch): dchi-text the
   * privatized ids, dchi-embedding the noisy embeddings (ΣL × n), laplace the noisy vectors
   * (b × r), ome the perturbed bits (b × r·l). */
  async privatizeData(items: TokenizedText[], source?: BitSource | null): Promise<PrivatizedData> {
    const m = this.mechanism;
    if (m instanceof DChiText || m instanceof DChiEmbedding) {
      const ids: number[] = [];
      for (const it of items) ids.push(...it.idsA, ...(it.idsB ?? []));
      if (m instanceof DChiText) return m.privatizeIds(ids, source);
      return m.privatize(this.bundle.rows(ids), this.bundle.dim, source);
    }
    const src = resolveSource(source);
    const { seqs, types } = this.sequences(items, src);
    const vecs = await this.encoder!.encode(seqs, types);
    return m instanceof Laplace ? m.privatize(vecs, this.encoder!.outputDim, src) : m.perturb(m.encode(vecs), src);
  }

  /** Encoder inputs [CLS] a [SEP] (b [SEP]) and token types, after word dropout (one draw per
   * word, a's then b's, item by item: numpy's order). */
  private sequences(items: TokenizedText[], src: BitSource): { seqs: number[][]; types: number[][] } {
    const sp = this.bundle.meta.special_ids;
    const mu = this.mechanism instanceof Laplace ? this.mechanism.wordDropout : 0;
    const drop = (ids: number[], words: number[] | undefined | null): number[] => {
      if (mu <= 0 || ids.length === 0) return ids;
      const nw = words![words!.length - 1]! + 1;
      const keep = Array.from({ length: nw }, () => src.nextDouble() >= mu);
      return ids.filter((_, k) => keep[words![k]!]);
    };
    const seqs: number[][] = [];
    const types: number[][] = [];
    for (const it of items) {
      const a = drop(it.idsA, it.wordsA);
      const b = it.idsB === null ? null : drop(it.idsB, it.wordsB);
      const first = [sp.cls!, ...a, sp.sep!];
      if (b === null) {
        seqs.push(first);
        types.push(first.map(() => 0));
      } else {
        const second = [...b, sp.sep!];
        seqs.push([...first, ...second]);
        types.push([...first.map(() => 0), ...second.map(() => 1)]);
      }
    }
    return { seqs, types };
  }

  /** The payload JSON of each item around {@link privatizeData}'s output. */
  payloads(items: TokenizedText[], data: PrivatizedData): string[] {
    const out: string[] = [];
    const id = this.bundle.bundleId;
    const m = this.mechanism;
    if (m instanceof Laplace) {
      const r = this.encoder!.outputDim;
      items.forEach((_, i) => out.push(vectorPayloadJson("laplace", this.params, id, {
        dtype: "float32", shape: [r], bytes: floatBytes((data as Float64Array).subarray(i * r, (i + 1) * r), "float32") })));
      return out;
    }
    if (m instanceof OME) {
      const nb = m.nBits;
      items.forEach((_, i) => out.push(vectorPayloadJson("ome", this.params, id, {
        dtype: "bits", shape: [nb], bytes: packBits((data as Uint8Array).subarray(i * nb, (i + 1) * nb)) })));
      return out;
    }
    let start = 0;
    const n = this.bundle.dim;
    for (const it of items) {
      const len = nTokens(it);
      let array: { dtype: string; shape: number[]; bytes: Uint8Array };
      if (data instanceof Int32Array) {
        array = { dtype: "int32", shape: [len], bytes: int32Bytes(data.subarray(start, start + len)) };
      } else {
        array = { dtype: this.floatDtype, shape: [len, n],
          bytes: floatBytes((data as Float64Array).subarray(start * n, (start + len) * n), this.floatDtype) };
      }
      out.push(tokenPayloadJson(this.name as "dchi-text" | "dchi-embedding", this.params, id, array, segments(it)));
      start += len;
    }
    return out;
  }

  /** One payload JSON per text (``pairs[i]`` the second sentence of pair i); TextError for an
   * empty text or, with truncation "error", one over the limit. */
  async privatize(texts: string[], source?: BitSource | null, pairs: string[] | null = null): Promise<string[]> {
    const items = this.tokenize(texts, pairs) as TokenizedText[];
    return this.payloads(items, await this.privatizeData(items, source));
  }

  async release(): Promise<void> {
    if (this.mechanism instanceof DChiText) await this.mechanism.release();
    if (this.encoder) await this.encoder.release();
  }
}

function checkLength(maxLength: number, limit: number): number {
  if (!Number.isInteger(maxLength) || maxLength < 4 || maxLength > limit) {
    throw new RangeError(`max_length must be an integer in [4, ${limit}], got ${maxLength}`);
  }
  return maxLength;
}
