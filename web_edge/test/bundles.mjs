// Bundles made here, without Python, as shared/bundle.py writes them: tokenizer.json (a BERT
// WordPiece tokenizer over a made-up vocabulary), embeddings.npy or a designed table
// (table.npy, float32 or int8 with table_scale.npy), bundle.json with every file's SHA-256 and
// the bundle_id hashed as shared.bundle._compute_id hashes it. Tests load them with the real
// EdgeBundle.fromFiles and damage them on purpose.
import { createHash } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { npyHeader } from "../dist/bundle/npy.js";
import { Pcg64Source } from "../dist/random/pcg64.js";
import { pyDumps } from "../dist/format/pyjson.js";
import { standardNormal } from "../dist/random/samplers.js";

export const SPECIAL = ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
const HASHED_META = ["format", "format_version", "vocab_size", "dim", "max_length", "special_ids",
  "unused_ids", "encoder", "files"];

export const sha256 = (b) => createHash("sha256").update(b).digest("hex");

/** The vocabulary: the special tokens, then ``words`` (default: w0, w1, ... up to ``size``). */
export function vocabulary(size, words = null) {
  const out = [...SPECIAL, ...(words ?? [])];
  for (let i = 0; out.length < size; i++) out.push(`w${i}`);
  return out.slice(0, size);
}

/** A BERT WordPiece tokenizer.json (the tokenizers library's layout) over ``vocab``. */
export function tokenizerJson(vocab) {
  const id = (t) => vocab.indexOf(t);
  const added = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"].map((t) => ({ id: id(t), content: t,
    single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
  return JSON.stringify({ version: "1.0", truncation: null, padding: null, added_tokens: added,
    normalizer: { type: "BertNormalizer", clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: true },
    pre_tokenizer: { type: "BertPreTokenizer" },
    post_processor: { type: "BertProcessing", sep: ["[SEP]", id("[SEP]")], cls: ["[CLS]", id("[CLS]")] },
    decoder: { type: "WordPiece", prefix: "##", cleanup: true },
    model: { type: "WordPiece", unk_token: "[UNK]", continuing_subword_prefix: "##", max_input_chars_per_word: 100,
      vocab: Object.fromEntries(vocab.map((t, i) => [t, i])) } });
}

/** numpy.save's bytes of a C-order array. */
export function npy(descr, shape, values) {
  const head = npyHeader(descr, shape);
  const data = new Uint8Array(values.buffer, values.byteOffset, values.byteLength);
  const out = new Uint8Array(head.length + data.length);
  out.set(head);
  out.set(data, head.length);
  return out;
}

/** rows × dim standard normals times ``scale`` (float32), from numpy's default_rng(seed). */
export function gaussianTable(rows, dim, seed = 0, scale = 1) {
  const rng = new Pcg64Source(seed);
  return Float32Array.from({ length: rows * dim }, () => scale * standardNormal(rng));
}

/** Symmetric per-column int8 as shared.table.quantize_int8: scale_j = max |v_ij| / 127 over the
 * rows (float32), q = round(v / scale) clipped to [-127, 127]. */
export function quantizeInt8(values, rows, dim) {
  const top = new Float64Array(dim);
  for (let i = 0; i < rows; i++) for (let k = 0; k < dim; k++) top[k] = Math.max(top[k], Math.abs(values[i * dim + k]));
  const scale = Float32Array.from(top, (t) => (t > 0 ? t : 1) / 127);
  const q = new Int8Array(rows * dim);
  for (let i = 0; i < rows * dim; i++) {
    const x = Math.round(values[i] / scale[i % dim]); // numpy rounds halves to even; any rounding gives a valid table
    q[i] = Math.max(-127, Math.min(127, x));
  }
  return { q, scale };
}

/**
 * The files of a bundle (name -> bytes, bundle.json included). ``values``: the privatization
 * table (vocab × tableDim float32) for kind "embeddings" (the original layout, tableDim = dim)
 * or "float32"; for "int8", ``q`` and ``scale``. ``tableBlock``: fields added to (or, with
 * undefined, removed from) the table block; ``meta``: fields of bundle.json to override.
 */
export function bundleFiles({ vocab, dim = 16, kind = "embeddings", values = null, q = null, scale = null,
  tableDim = null, tableBlock = {}, meta = {}, extraFiles = {} }) {
  const k = kind === "embeddings" ? dim : (tableDim ?? (scale ? scale.length : values.length / vocab.length));
  const files = { "tokenizer.json": new TextEncoder().encode(tokenizerJson(vocab)), ...extraFiles };
  let table = null;
  if (kind === "embeddings") {
    files["embeddings.npy"] = npy("<f4", [vocab.length, dim], values);
  } else if (kind === "float32") {
    files["table.npy"] = npy("<f4", [vocab.length, k], values);
    table = { name: `pca${k}`, dim: k, dtype: "float32", projection: { kind: "pca", k, fitted_on: "table", centred: true },
      quantization: null, source: { model: "test", dim }, file: "table.npy" };
  } else {
    files["table.npy"] = npy("|i1", [vocab.length, k], q);
    files["table_scale.npy"] = npy("<f4", [k], scale);
    table = { name: `pca${k}-int8`, dim: k, dtype: "int8", projection: { kind: "pca", k, fitted_on: "table", centred: true },
      quantization: { kind: "int8-symmetric-per-column", dequantized: "float32(q) * scale" },
      source: { model: "test", dim }, file: "table.npy", scale_file: "table_scale.npy" };
  }
  if (table !== null) {
    for (const [key, v] of Object.entries(tableBlock)) {
      if (v === undefined) delete table[key];
      else table[key] = v;
    }
  }
  const m = { format: "privbert-edge-bundle", format_version: 1, vocab_size: vocab.length, dim, max_length: 64,
    special_ids: { pad: vocab.indexOf("[PAD]"), unk: vocab.indexOf("[UNK]"), cls: vocab.indexOf("[CLS]"),
      sep: vocab.indexOf("[SEP]"), mask: vocab.indexOf("[MASK]") },
    unused_ids: vocab.flatMap((t, i) => (/^\[unused\d+\]$/.test(t) ? [i] : [])), encoder: null,
    info: { source: "test", hidden_size: dim },
    files: Object.fromEntries(Object.entries(files).sort().map(([n, b]) => [n, sha256(b)])), ...(table ? { table } : {}),
    ...meta };
  const hashed = Object.fromEntries(HASHED_META.map((key) => [key, m[key] ?? null]));
  if (m.table !== undefined && m.table !== null) hashed.table = m.table;
  m.bundle_id = sha256(pyDumps(hashed));
  return { ...files, "bundle.json": new TextEncoder().encode(JSON.stringify(m, null, 2)), id: m.bundle_id };
}

/** The files as a reader for EdgeBundle.fromFiles. */
export function reader(files) {
  return (name) => (name === "id" ? undefined : files[name]);
}

/** Write the files into ``dir`` (a bundle directory, as --bundle DIR reads it). */
export function writeBundleDir(dir, files) {
  mkdirSync(dir, { recursive: true });
  for (const [name, bytes] of Object.entries(files)) if (name !== "id") writeFileSync(join(dir, name), bytes);
  return dir;
}
