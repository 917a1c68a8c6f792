/**
 * Tokenized texts as the mechanisms receive them, and the payloads of the mechanisms that send
 * one array per text (token ids, or one row per token).
 *
 * A token mechanism's privatize step gets a {@link TokenBatch}: every text's word pieces, by
 * text and by segment (a sentence pair's two), and the same ids concatenated in that order
 * (numpy's draw order: the Python edge privatizes a batch's tokens in one call). Anything that
 * decides per token (which of a text's word pieces to privatize) reads the per-text view and
 * answers with one entry per position of the concatenation.
 */

import type { TokenPolicy } from "../bundle/policy.js";
import { payloadJson, type PayloadArray } from "../service/payload.js";

export type { PayloadArray };

/** Word-piece ids of one text (or pair) after the length policy. */
export interface TokenizedText {
  idsA: number[];
  idsB: number[] | null;
  /** word pieces before truncation */
  nBefore: number;
  /** where a mechanism asks for them (word dropout): the word of each kept piece */
  wordsA?: number[];
  wordsB?: number[] | null;
  /** where a token policy asks (edge_agent's TokenizedText.cut_a/cut_b): truncation cut a word
   * of segment A (B), the first piece dropped being a "##" piece, so the last piece kept is part
   * of a longer word (never a public word) */
  cutA?: boolean;
  cutB?: boolean;
}

/** How many of an item's word pieces are public words under ``policy`` (both segments, each
 * word by word: edge_agent's Privatizer.public_count). */
export function publicCount(t: TokenizedText, policy: TokenPolicy): number {
  return policy.publicCount(t.idsA, t.cutA ?? false) + (t.idsB === null ? 0 : policy.publicCount(t.idsB, t.cutB ?? false));
}

/** The word pieces of an item, both segments: what a token payload carries and dχ charges. */
export function nTokens(t: TokenizedText): number {
  return t.idsA.length + (t.idsB?.length ?? 0);
}

/** A pair's segment lengths (a payload's `segments`), null for a single text. */
export function segments(t: TokenizedText): number[] | null {
  return t.idsB === null ? null : [t.idsA.length, t.idsB.length];
}

/** The tokenized texts of one privatize call. */
export class TokenBatch {
  /** every text's word pieces, segment after segment, text after text */
  readonly flat: Int32Array;
  /** text i's word pieces are flat[offsets[i] .. offsets[i + 1]) */
  readonly offsets: Int32Array;

  constructor(readonly items: readonly TokenizedText[]) {
    this.offsets = new Int32Array(items.length + 1);
    items.forEach((it, i) => {
      this.offsets[i + 1] = this.offsets[i]! + nTokens(it);
    });
    this.flat = new Int32Array(this.offsets[items.length]!);
    items.forEach((it, i) => {
      const at = this.offsets[i]!;
      this.flat.set(it.idsA, at);
      if (it.idsB !== null) this.flat.set(it.idsB, at + it.idsA.length);
    });
  }

  get size(): number {
    return this.items.length;
  }

  /** The public words of ``policy`` in the batch, one entry per position of {@link flat}: each
   * text's segments masked word by word, with their cut flags (shared.policy.public_masks). */
  publicMask(policy: TokenPolicy): Uint8Array {
    const out = new Uint8Array(this.flat.length);
    this.items.forEach((it, i) => {
      const at = this.offsets[i]!;
      out.set(policy.publicMask(it.idsA, it.cutA ?? false), at);
      if (it.idsB !== null) out.set(policy.publicMask(it.idsB, it.cutB ?? false), at + it.idsA.length);
    });
    return out;
  }

  /** Text i's segments (one, or a pair's two), each its word-piece ids. */
  segments(i: number): (readonly number[])[] {
    const it = this.items[i]!;
    return it.idsB === null ? [it.idsA] : [it.idsA, it.idsB];
  }
}

/** One payload per text of ``batch``: ``array(start, length)`` gives the array of the tokens
 * flat[start .. start + length). */
export function tokenPayloads(mechanism: string, params: Readonly<Record<string, number | string>>, bundleId: string,
                              batch: TokenBatch, array: (start: number, length: number) => PayloadArray): string[] {
  return batch.items.map((it, i) => {
    const start = batch.offsets[i]!;
    return payloadJson(mechanism, params, bundleId, array(start, nTokens(it)), segments(it));
  });
}
