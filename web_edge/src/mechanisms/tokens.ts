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
