/**
 * Texts → privatized payloads, on the device (edge_agent/privatizer.py for the token
 * mechanisms). Word pieces of the bundle's tokenizer without [CLS]/[SEP] (the server adds
 * them), then the dχ mechanism on all tokens of a batch at once.
 *
 * Length policy (the Python edge's): at most ``max_length − 2`` word pieces for a text,
 * ``max_length − 3`` for a pair; "first" keeps the first ones (a pair trims its longer segment
 * first, the second on a tie), "error" refuses the text. A text without word pieces is refused
 * ({@link TextError} "empty"), or skipped by a caller that allows it (the CLI skips and counts
 * it, as edge-agent does).
 */

import type { EdgeBundle } from "./bundle.js";
import { DChiEmbedding, DChiText, maxRowNorm, checkDchiEta } from "./dchi.js";
import { TextError } from "./errors.js";
import { checkDchiFloor, type FloorCache } from "./floor.js";
import { ExactNearest, type NearestOptions } from "./nearest.js";
import { floatBytes, int32Bytes, tokenPayloadJson, type FloatDtype, type TokenMechanism } from "./payload.js";
import type { BitSource } from "./random.js";
import { TextTokenizer } from "./tokenizer.js";

export const TOKEN_MECHANISMS = ["dchi-text", "dchi-embedding"] as const;
const PYTHON_ONLY: Record<string, string> = {
  texthide: "texthide stays in the Python edge (edge-agent): it has no differential-privacy "
    + "guarantee and needs a secret mask pool; use edge-agent privatize --mechanism texthide",
  laplace: "laplace is not in the web edge yet (it needs the bundle's sentence encoder); use "
    + "edge-agent privatize --mechanism laplace",
  ome: "ome is not in the web edge yet (it needs the bundle's sentence encoder); use "
    + "edge-agent privatize --mechanism ome",
  none: "mechanism none sends plain token ids the server can read: the web edge does not send them",
};

/** Word-piece ids of one text (or pair) after the length policy. */
export interface TokenizedText {
  idsA: number[];
  idsB: number[] | null;
  /** word pieces before truncation */
  nBefore: number;
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
  mechanism: TokenMechanism | string;
  eta: number;
  /** the model's length limit incl. [CLS]/[SEP] (default: the bundle's) */
  maxLength?: number | null;
  truncate?: "first" | "error";
  /** dchi-embedding payloads: float32 (default) or float16 */
  floatDtype?: FloatDtype;
  /** privatize even below the privacy floor (the output is then close to the raw text) */
  allowWeakPrivacy?: boolean;
  /** where the floor's exit distances are kept between runs (per bundle) */
  floorCache?: FloorCache | null;
}

/** Texts → payloads of one mechanism, parameters and bundle. */
export class Privatizer {
  readonly tokenizer: TextTokenizer;
  readonly params: { eta: number };

  private constructor(readonly bundle: EdgeBundle, readonly name: TokenMechanism,
                      readonly mechanism: DChiText | DChiEmbedding, readonly maxLength: number,
                      readonly truncate: "first" | "error", readonly floatDtype: FloatDtype,
                      /** why the parameters are weaker than the floor (only with allowWeakPrivacy) */
                      readonly weakPrivacy: string | null) {
    this.tokenizer = new TextTokenizer(bundle.tokenizerJson);
    this.params = { eta: mechanism.eta };
  }

  /**
   * The privatizer for ``options``: RangeError for invalid parameters, WeakPrivacyError for
   * parameters weaker than the privacy floor (unless ``allowWeakPrivacy``), an Error naming the
   * Python edge for the mechanisms that stay there.
   */
  static async create(bundle: EdgeBundle, options: PrivatizerOptions): Promise<Privatizer> {
    const name = options.mechanism;
    if (name in PYTHON_ONLY) throw new RangeError(PYTHON_ONLY[name]!);
    if (name !== "dchi-text" && name !== "dchi-embedding") {
      throw new RangeError(`no payload format for mechanism ${JSON.stringify(name)}; one of dchi-text, dchi-embedding`);
    }
    const truncate = options.truncate ?? "first";
    if (truncate !== "first" && truncate !== "error") throw new RangeError(`truncate must be one of first, error, got ${truncate}`);
    const floatDtype = options.floatDtype ?? "float32";
    const limit = bundle.maxLength;
    const maxLength = options.maxLength ?? limit;
    if (!Number.isInteger(maxLength) || maxLength < 4 || maxLength > limit) {
      throw new RangeError(`max_length must be an integer in [4, ${limit}], got ${maxLength}`);
    }
    let mech: DChiText | DChiEmbedding;
    let index: ExactNearest;
    const makeIndex = (t: Float32Array, rows: number): Promise<ExactNearest> =>
      ExactNearest.create(t, rows, bundle.dim, null, { ...options, backend: options.backend ?? "auto" });
    if (name === "dchi-text") {
      const m = await DChiText.create(bundle, options.eta, options);
      mech = m;
      index = m.index;
    } else {
      mech = new DChiEmbedding(options.eta);
      let tMax = 0;
      for (const x of bundle.embeddings) tMax = Math.max(tMax, Math.abs(x));
      checkDchiEta(options.eta, bundle.dim, tMax, floatDtype, false);
      const reg = bundle.regularIds;
      index = await ExactNearest.create(bundle.rows(reg), reg.length, bundle.dim, reg, options);
    }
    try {
      const weak = await checkDchiFloor(name, options.eta, bundle, index, {
        cache: options.floorCache ?? null, allowWeak: options.allowWeakPrivacy ?? false, makeIndex,
      });
      return new Privatizer(bundle, name, mech, maxLength, truncate, floatDtype, weak);
    } finally {
      if (name === "dchi-embedding") await index.release();
    }
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
    return texts.map((text, i) => {
      let a = this.tokenizer.encode(text);
      let b = pairs === null ? null : this.tokenizer.encode(pairs[i]!);
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
      return { idsA: a, idsB: b, nBefore: n };
    });
  }

  /** The mechanism's output for tokenized items, all tokens in one call: dchi-text the
   * privatized ids, dchi-embedding the noisy embeddings (ΣL × n). */
  async privatizeData(items: TokenizedText[], source?: BitSource | null): Promise<Int32Array | Float64Array> {
    const ids: number[] = [];
    for (const it of items) ids.push(...it.idsA, ...(it.idsB ?? []));
    if (this.mechanism instanceof DChiText) return this.mechanism.privatizeIds(ids, source);
    return this.mechanism.privatize(this.bundle.rows(ids), this.bundle.dim, source);
  }

  /** The payload JSON of each item around {@link privatizeData}'s output. */
  payloads(items: TokenizedText[], data: Int32Array | Float64Array): string[] {
    const out: string[] = [];
    let start = 0;
    const n = this.bundle.dim;
    for (const it of items) {
      const len = nTokens(it);
      let array: { dtype: string; shape: number[]; bytes: Uint8Array };
      if (data instanceof Int32Array) {
        array = { dtype: "int32", shape: [len], bytes: int32Bytes(data.subarray(start, start + len)) };
      } else {
        array = { dtype: this.floatDtype, shape: [len, n],
          bytes: floatBytes(data.subarray(start * n, (start + len) * n), this.floatDtype) };
      }
      out.push(tokenPayloadJson(this.name, this.params, this.bundle.bundleId, array, segments(it)));
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
  }
}

export { maxRowNorm };
