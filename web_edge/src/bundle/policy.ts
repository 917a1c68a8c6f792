/**
 * A bundle's token policy (shared/policy.py): the public words it may send as they are
 * (SanText+, Yue et al., Findings of ACL 2021, §3.3). `bundle.json`'s `policy` block (its name,
 * source, size, the sorted list of tokens and their SHA-256; the bundle id covers it) is checked
 * whole, as `TokenPolicy.from_block` checks it and with its refusals (shared/messages.py's
 * templates): every token one of the spec's reference list (function words of scikit-learn's stop
 * list and ASCII punctuation, `POLICY.reference`), a regular token of the bundle's tokenizer, the
 * digest right. Which word pieces of a text are public is decided word by word: a listed piece is
 * public only as a whole word (not a "##" piece, not followed by one; a text truncated right
 * after it with a "##" piece dropped next is cut, and its last piece is not public).
 *
 * The coin of SanText+ ({@link keptPublic}) draws one uniform double per public token, in order,
 * from the caller's source: numpy's `rng.random(n)`, so a seeded run keeps the tokens the Python
 * edge keeps.
 */

import { BundleError } from "../errors.js";
import { compareCodePoints, jsonDumpsUnicode, pyStrRepr, type RawJson } from "../format/pyjson.js";
import { message } from "../format/messages.js";
import { POLICY } from "../generated/spec.js";
import type { BitSource } from "../random/random.js";
import { sha256Hex } from "./sha256.js";

/** what an edge accepts as public (shared.policy.REFERENCE) */
const REFERENCE: ReadonlySet<string> = new Set<string>(POLICY.reference);
/** a WordPiece that continues the word before it */
const CONTINUATION: string = POLICY.continuation_prefix;

/** SHA-256 of the sorted token list as compact JSON (shared.policy.tokens_digest). */
export async function tokensDigest(tokens: readonly string[]): Promise<string> {
  const sorted = [...tokens].sort(compareCodePoints);
  return sha256Hex(new TextEncoder().encode(jsonDumpsUnicode(sorted)));
}

/** The vocabulary of a tokenizer.json, added tokens included (tokenizers' get_vocab(with_added_tokens=True)). */
export function tokenizerVocab(tokenizerJson: string): Map<string, number> {
  const cfg = JSON.parse(tokenizerJson) as { model?: { vocab?: unknown }; added_tokens?: unknown };
  const out = new Map<string, number>();
  const vocab = cfg.model?.vocab;
  if (vocab !== null && typeof vocab === "object" && !Array.isArray(vocab)) {
    for (const [t, i] of Object.entries(vocab as Record<string, unknown>)) if (Number.isInteger(i)) out.set(t, i as number);
  }
  if (Array.isArray(cfg.added_tokens)) {
    for (const a of cfg.added_tokens as { id?: unknown; content?: unknown }[]) {
      if (typeof a?.content === "string" && Number.isInteger(a.id)) out.set(a.content, a.id as number);
    }
  }
  return out;
}

/** Python's `x != n` for a JSON value x read by json.loads and an int n (True == 1, 3.0 == 3). */
function pyEqualsInt(x: RawJson | undefined, n: number): boolean {
  if (x === undefined) return false;
  if (x.kind === "lit") return x.value !== null && Number(x.value) === n;
  return x.kind === "num" && Number(x.text) === n;
}

/** A bundle's public words, as token masks over its vocabulary. */
export class TokenPolicy {
  private constructor(
    readonly name: string,
    /** how many tokens the list holds */
    readonly size: number,
    /** SHA-256 of the list (bundle.json's `sha256`) */
    readonly digest: string,
    /** 1 for each listed token id */
    readonly publicIds: Uint8Array,
    /** 1 for each "##" piece (never a whole word) */
    readonly continuation: Uint8Array,
  ) {}

  /**
   * The policy of a `policy` block (its raw JSON, as bundle.json holds it), checked whole in
   * shared.policy's order and words: its fields, sorted and distinct tokens as many as its size,
   * its digest, every token one of the reference list, every token a regular token of ``vocab``.
   * BundleError (one line) otherwise.
   */
  static async fromBlock(block: RawJson, vocab: ReadonlyMap<string, number>, regular: ArrayLike<number>,
                         where: string): Promise<TokenPolicy> {
    if (block.kind !== "obj") throw new BundleError(message("POLICY_NOT_OBJECT", { where }));
    const get = (k: string): RawJson | undefined => {
      let found: RawJson | undefined;
      for (const [key, v] of block.entries) if (key === k) found = v; // the last one wins, as json.loads
      return found;
    };
    const [tokensRaw, digestRaw, nameRaw] = [get("tokens"), get("sha256"), get("name")];
    if (nameRaw?.kind !== "str" || digestRaw?.kind !== "str" || tokensRaw?.kind !== "arr"
        || !tokensRaw.items.every((t) => t.kind === "str")) {
      throw new BundleError(message("POLICY_FIELDS", { where }));
    }
    const name = nameRaw.value;
    const tokens = tokensRaw.items.map((t) => (t as { value: string }).value);
    const distinct = [...new Set(tokens)].sort(compareCodePoints);
    if (distinct.length !== tokens.length || distinct.some((t, i) => t !== tokens[i])
        || !pyEqualsInt(get("size"), tokens.length)) {
      throw new BundleError(message("POLICY_ORDER", { where }));
    }
    if (await tokensDigest(tokens) !== digestRaw.value) throw new BundleError(message("POLICY_DIGEST", { where }));
    const outside = tokens.filter((t) => !REFERENCE.has(t));
    if (outside.length) {
      throw new BundleError(message("POLICY_NOT_PUBLIC", { where, name, count: outside.length,
        example: pyStrRepr(outside[0]!) }));
    }
    let size = 0;
    for (const i of vocab.values()) size = Math.max(size, i + 1);
    const isRegular = new Uint8Array(size);
    for (let k = 0; k < regular.length; k++) if (regular[k]! < size) isRegular[regular[k]!] = 1;
    const pub = new Uint8Array(size);
    for (const t of tokens) {
      const i = vocab.get(t);
      if (i === undefined || !isRegular[i]) {
        throw new BundleError(message("POLICY_NOT_REGULAR", { where, name, token: pyStrRepr(t) }));
      }
      pub[i] = 1;
    }
    const continuation = new Uint8Array(size);
    for (const [t, i] of vocab) if (t.startsWith(CONTINUATION)) continuation[i] = 1;
    return new TokenPolicy(name, tokens.length, digestRaw.value, pub, continuation);
  }

  /** Whether token ``id`` is a "##" piece. */
  continues(id: number): boolean {
    return this.continuation[id] === 1;
  }

  /**
   * Which of ``ids`` (one text's word pieces, in order) are public (1): a listed token that is a
   * whole word, not a "##" piece and not followed by one. ``cut``: the text was truncated right
   * after its last piece and the first piece dropped was a "##" piece (that last piece is then
   * part of a longer word, never public).
   */
  publicMask(ids: ArrayLike<number>, cut = false): Uint8Array {
    const n = ids.length;
    const out = new Uint8Array(n);
    for (let k = 0; k < n; k++) {
      out[k] = this.publicIds[ids[k]!] === 1 && (k + 1 === n || !this.continues(ids[k + 1]!)) ? 1 : 0;
    }
    if (cut && n) out[n - 1] = 0;
    return out;
  }

  /** How many of ``ids`` are public words ({@link publicMask}). */
  publicCount(ids: ArrayLike<number>, cut = false): number {
    return this.publicMask(ids, cut).reduce((a, x) => a + x, 0);
  }

  /** What the guarantee says of the policy (shared.policy.TokenPolicy.describe). */
  describe(): { name: string; size: number; sha256: string } {
    return { name: this.name, size: this.size, sha256: this.digest };
  }
}

/**
 * Which tokens are sent as they are (1): each public token with probability 1 − p, one uniform
 * double per public token in order from ``source`` (shared.policy.kept_public: numpy's
 * `rng.random(n)`, `u >= p`), the others never. No draw when the batch has no public token.
 */
export function keptPublic(publicMask: Uint8Array, p: number, source: BitSource): Uint8Array {
  const keep = new Uint8Array(publicMask.length);
  for (let k = 0; k < publicMask.length; k++) if (publicMask[k]) keep[k] = source.nextDouble() >= p ? 1 : 0;
  return keep;
}
