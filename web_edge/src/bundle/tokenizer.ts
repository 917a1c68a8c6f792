/**
 * The bundle's WordPiece tokenizer for user text, through `@huggingface/tokenizers` (pure JS),
 * set up as `EdgeBundle.text_tokenizer()` in shared/bundle.py: no padding, no truncation (the
 * edge applies its own length policy), no [CLS]/[SEP] (the server adds them), and special tokens
 * typed in the text ("[CLS]", "[MASK]" ...) read as plain text, never as the special tokens
 * (which are never privatized and would pass through in clear).
 */

import { Tokenizer } from "@huggingface/tokenizers";

/** The part of `Tokenizer` used here, as @huggingface/tokenizers 0.2.0 declares it
 * (types/core/Tokenizer.d.ts): that package's declarations import each other without file
 * extensions, which NodeNext resolution does not follow, so TypeScript sees the class as
 * untyped. */
interface WordPieceTokenizer {
  encode(text: string, options: { add_special_tokens: boolean }): { ids: number[]; tokens: string[] };
  decode(ids: number[]): string;
}
const WordPieceTokenizer = Tokenizer as new (tokenizerJson: object, config: object) => WordPieceTokenizer;

interface TokenizerJson {
  added_tokens?: { special?: boolean }[];
  padding?: unknown;
  truncation?: unknown;
  [k: string]: unknown;
}

export class TextTokenizer {
  private readonly tok: WordPieceTokenizer;

  constructor(tokenizerJson: string) {
    const cfg = JSON.parse(tokenizerJson) as TokenizerJson;
    cfg.padding = null;
    cfg.truncation = null;
    // special tokens are not split out of the text: "[CLS]" typed by a user is plain text
    cfg.added_tokens = (cfg.added_tokens ?? []).filter((t) => !t.special);
    this.tok = new WordPieceTokenizer(cfg, {});
  }

  /** Word-piece ids of ``text`` (no special tokens added). */
  encode(text: string): number[] {
    return this.tok.encode(text, { add_special_tokens: false }).ids;
  }

  /** Word-piece ids of ``text`` and the word of each piece (0, 1, … : a piece that does not
   * start with "##" starts a word, as the BERT pre-tokenizer's word ids), for word dropout. */
  encodeWords(text: string): { ids: number[]; words: number[] } {
    const enc = this.tok.encode(text, { add_special_tokens: false });
    const words: number[] = [];
    let w = -1;
    for (const t of enc.tokens) {
      if (!t.startsWith("##") || w < 0) w++;
      words.push(w);
    }
    return { ids: enc.ids, words };
  }

  /** Text of ``ids`` (the privatized text of a dχ-text payload, for display). */
  decode(ids: ArrayLike<number>): string {
    if (ids.length === 0) return "";
    return this.tok.decode(Array.from(ids));
  }
}
