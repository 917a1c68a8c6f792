/**
 * The text floor of shared/floor_text.py (issue 42): for a bundle this edge does not know
 * (../bundle/trust.ts), dχ is also measured on a small sample of public text shipped with the
 * edge (../generated/public_text.ts), tokenized by the bundle's own tokenizer:
 *
 * - pieces per word against the public model's (a tokenizer that cuts words far finer is
 *   refused: its pieces are what a server reads back);
 * - the share of the sample's readable tokens (special tokens aside) sent unchanged;
 * - the share a context-free Bayes decoder recovers, y ↦ argmax_x P(x)·P̂(y|x), P(x) from the
 *   sample, the channel drawn with the generator (OS entropy unless a seeded one is passed)
 *   on the sample at every check, each draw scored by the decoder estimated from every other
 *   draw (leave-one-out).
 *
 * The occurrences are privatized in an order drawn from the generator (numpy's permutation,
 * the whole sample up to ROUNDS times) in steps of TEXT_FIRST, then as many as were drawn,
 * until the Wilson interval (z = 5) of the larger share lies on one side of the line. Drawn in
 * numpy's order from the same generator, a seeded run gives the Python edge's figures and
 * message. Every constant is shared.floor_text's, read from the spec.
 *
 * Under a token policy (issue 41) only the sample's tokens outside the policy's public list are
 * privatized and judged: a public word may go out as typed by design (with probability 1 − p),
 * has no guarantee, and says nothing of how the table treats the others (as the privacy floor's
 * floorTokens).
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import type { TokenPolicy } from "../bundle/policy.js";
import type { TextTokenizer } from "../bundle/tokenizer.js";
import type { DChiText } from "../mechanisms/dchi.js";
import { TEXT_FLOOR } from "../generated/spec.js";
import { PUBLIC_TEXT } from "../generated/public_text.js";
import { message, pct } from "../format/messages.js";
import { resolveSource, type BitSource } from "../random/random.js";
import { permutation } from "../random/samplers.js";
import { MEASURE_Z, wilsonInterval } from "./floor.js";
import { keptPass, rememberPass, type TextFloorCache } from "./text_floor_cache.js";
import { WeakPrivacyError } from "../errors.js";
import { measure as measure_, now } from "../timing.js";

export const DECODE_LINE: number = TEXT_FLOOR.DECODE_LINE;
export const PIECES_RATIO: number = TEXT_FLOOR.PIECES_RATIO;
export const ROUNDS: number = TEXT_FLOOR.ROUNDS;
export const TEXT_FIRST: number = TEXT_FLOOR.TEXT_FIRST;
export const MIN_TOKENS: number = TEXT_FLOOR.MIN_TOKENS;
export const PUBLIC_PIECES_PER_WORD: number = TEXT_FLOOR.PUBLIC_PIECES_PER_WORD;

/** The public sample, one sentence per line. */
export function sampleSentences(): string[] {
  return PUBLIC_TEXT.split(/\r?\n/).map((s) => s.trim()).filter((s) => s !== "");
}

/** Whitespace words of the sample (Python's str.split). */
export function sampleWords(): number {
  return sampleSentences().reduce((n, s) => n + s.split(/\s+/).filter(Boolean).length, 0);
}

/** What the text floor measured on one bundle at one η (shared.floor_text.TextMeasure). */
export interface TextMeasure {
  pieces: number;
  words: number;
  /** readable (non-special) pieces: the occurrences privatized */
  tokens: number;
  draws: number;
  unchanged: number;
  decoded: number;
}

/**
 * How many draws (x[i] → y[i]) the context-free Bayes decoder returns to their input when it
 * is estimated from every other draw: y ↦ argmax over x' of c(x')·n(x', y)/n(x') (c the
 * sample's counts, n the draws' without draw i); ties to x' = y, then the smaller id; an
 * output no other draw produced is decoded as itself (shared.floor_text.leave_one_out).
 */
export function leaveOneOut(x: ArrayLike<number>, y: ArrayLike<number>, prior: ReadonlyMap<number, number>): number {
  const nX = new Map<number, number>();
  const nXY = new Map<number, Map<number, number>>();
  for (let i = 0; i < x.length; i++) {
    const a = x[i]!;
    const b = y[i]!;
    nX.set(a, (nX.get(a) ?? 0) + 1);
    let row = nXY.get(b);
    if (row === undefined) nXY.set(b, (row = new Map<number, number>()));
    row.set(a, (row.get(a) ?? 0) + 1);
  }
  let hits = 0;
  for (let i = 0; i < x.length; i++) {
    const a = x[i]!;
    const b = y[i]!;
    let best: [number, number, number] | null = null;
    for (const [c, n] of nXY.get(b)!) {
      const m = c === a ? n - 1 : n;
      const k = c === a ? nX.get(c)! - 1 : nX.get(c)!;
      if (m <= 0) continue;
      const key: [number, number, number] = [(prior.get(c)! * m) / k, c === b ? 1 : 0, -c];
      if (best === null || key[0] > best[0] || (key[0] === best[0] && (key[1] > best[1]
          || (key[1] === best[1] && key[2] > best[2])))) {
        best = key;
      }
    }
    if ((best === null ? b : -best[2]) === a) hits++;
  }
  return hits;
}

/** The sample's word pieces under the bundle's tokenizer, sentence after sentence. */
export function sampleIds(tokenizer: TextTokenizer): number[] {
  const out: number[] = [];
  for (const s of sampleSentences()) out.push(...tokenizer.encode(s));
  return out;
}

/**
 * Privatize the sample's readable tokens with ``text`` (shared.floor_text.measure_text):
 * the order drawn from ``source``, steps of {@link TEXT_FIRST} then as many as were drawn,
 * until the Wilson interval of the larger of the decoded and unchanged shares lies on one
 * side of ``line``, or the whole sample was drawn {@link ROUNDS} times. ``policy``: the token
 * policy applied (its public words are neither privatized nor judged).
 */
export async function measureText(text: DChiText, tokenizer: TextTokenizer, source?: BitSource | null,
                                  line = DECODE_LINE, policy: TokenPolicy | null = null): Promise<TextMeasure> {
  const src = resolveSource(source);
  const bundle: EdgeBundle = text.bundle;
  const ids = sampleIds(tokenizer);
  const special = new Set(Object.values(bundle.meta.special_ids));
  const tokens = ids.filter((i) => !special.has(i) && (policy === null || policy.publicIds[i] !== 1));
  const words = sampleWords();
  if (tokens.length < MIN_TOKENS || ids.length / words / PUBLIC_PIECES_PER_WORD > PIECES_RATIO) {
    return { pieces: ids.length, words, tokens: tokens.length, draws: 0, unchanged: 0, decoded: 0 }; // refused as it is
  }
  const prior = new Map<number, number>();
  for (const a of tokens) prior.set(a, (prior.get(a) ?? 0) + 1);
  const x: number[] = [];
  for (let r = 0; r < ROUNDS; r++) for (const i of permutation(src, tokens.length)) x.push(tokens[i]!);
  const y = new Int32Array(x.length);
  let drawn = 0;
  let unchanged = 0;
  let decoded = 0;
  while (drawn < x.length) {
    const size = Math.min(Math.max(drawn, TEXT_FIRST), x.length - drawn);
    y.set(await text.privatizeIds(x.slice(drawn, drawn + size), src), drawn);
    drawn += size;
    unchanged = 0;
    for (let i = 0; i < drawn; i++) if (y[i] === x[i]) unchanged++;
    decoded = leaveOneOut(x.slice(0, drawn), y.subarray(0, drawn), prior);
    const [lo, hi] = wilsonInterval(Math.max(decoded, unchanged), drawn, MEASURE_Z);
    if (lo > line || hi <= line) break;
  }
  return { pieces: ids.length, words, tokens: tokens.length, draws: drawn, unchanged, decoded };
}

/**
 * Null if dχ-text at ``text``'s η passes the text floor on its bundle (``m``: what was
 * measured), else the one-line reason, worded as shared.floor_text's. ``trust``: how this
 * edge trusts a bundle (the refusal names it: "--trusted-bundles", "the trustedBundles option").
 */
export function textFloorReason(bundleId: string, eta: number, m: TextMeasure, trust: string): string | null {
  const head = message("TEXT_FLOOR_HEAD", { bundle_id12: bundleId.slice(0, 12), eta });
  const tail = message("TEXT_FLOOR_TAIL", { trust });
  const ppw = m.pieces / m.words;
  const ratio = ppw / PUBLIC_PIECES_PER_WORD;
  if (ratio > PIECES_RATIO) {
    return message("TEXT_FLOOR_PIECES", { head, ppw, public: PUBLIC_PIECES_PER_WORD, ratio, limit: PIECES_RATIO, tail });
  }
  if (m.tokens < MIN_TOKENS) {
    return message("TEXT_FLOOR_UNREAD", { head, tokens: m.tokens, pieces: m.pieces, least: MIN_TOKENS, tail });
  }
  const dec = m.draws ? m.decoded / m.draws : 0;
  const same = m.draws ? m.unchanged / m.draws : 0;
  if (Math.max(dec, same) > DECODE_LINE) {
    return message("TEXT_FLOOR_DECODED", { head, decoded: pct(dec), unchanged: pct(same), draws: m.draws,
      line: pct(DECODE_LINE), tail });
  }
  return null;
}

export interface TextFloorOptions {
  /** what the measurement draws from: OS entropy by default (a seeded generator for tests) */
  source?: BitSource | null;
  /** passed measurements kept between loads (./text_floor_cache.ts), signed by this device */
  cache?: TextFloorCache | null;
  /** how this edge trusts a bundle, named by a refusal (default "--trusted-bundles") */
  trustHow?: string;
  /** privatize even below the text floor (the output is then close to the raw text) */
  allowWeak?: boolean;
  /** the token policy applied: the floor judges the tokens outside its public list */
  policy?: TokenPolicy | null;
}

/** What the text floor found: the measurement, why it fails (null: it passes), and whether
 * the measurement came from the signed cache. */
export interface TextFloorResult {
  measure: TextMeasure;
  reason: string | null;
  cached: boolean;
}

/**
 * The text floor of an unverified bundle at ``text``'s η: a signed kept pass when the cache has
 * one for this bundle and η, else measured now (and kept when it passes). A failure throws
 * {@link WeakPrivacyError} unless ``allowWeak``.
 */
export async function checkTextFloor(text: DChiText, tokenizer: TextTokenizer,
                                     options: TextFloorOptions = {}): Promise<TextFloorResult> {
  const id = text.bundle.bundleId;
  const how = options.trustHow ?? "--trusted-bundles";
  const cache = options.cache ?? null;
  const policy = options.policy ?? null;
  // a pass under a policy judged fewer tokens: kept apart from the bundle's pass without one
  const entry = policy === null ? id : `${id}+policy:${policy.name}`;
  if (cache !== null) {
    const kept = await keptPass(cache, entry, text.eta, (m) => textFloorReason(id, text.eta, m, how) === null)
      .catch(() => null);
    if (kept !== null) return { measure: kept, reason: null, cached: true };
  }
  const t0 = now();
  const measure = await measureText(text, tokenizer, options.source, DECODE_LINE, policy);
  measure_("text-floor", t0);
  const reason = textFloorReason(id, text.eta, measure, how);
  if (reason === null && cache !== null) await rememberPass(cache, entry, text.eta, measure).catch(() => undefined);
  if (reason !== null && !options.allowWeak) throw new WeakPrivacyError(reason);
  return { measure, reason, cached: false };
}
