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
import { PUBLIC_TEXT } from "../dist/generated/public_text.js";

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

/** The pieces of the public sample (../dist/generated/public_text.js) as a BERT tokenizer
 * splits them (lower case; punctuation on its own), most frequent first: a vocabulary that
 * reads all of the text floor's sample, as a real model's does. */
export function samplePieces() {
  const counts = new Map();
  for (const p of PUBLIC_TEXT.toLowerCase().match(/[a-z0-9]+|[^\sa-z0-9]/g)) counts.set(p, (counts.get(p) ?? 0) + 1);
  return [...counts.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).map(([p]) => p);
}

/** An English vocabulary of ``size`` tokens: the specials, the sample's pieces, single letters
 * as word starts and continuations (``##a``), then fillers. */
export function englishVocabulary(size) {
  const letters = "abcdefghijklmnopqrstuvwxyz".split("");
  const words = [...new Set([...samplePieces(), ...letters, ...letters.map((c) => `##${c}`)])];
  return vocabulary(size, words);
}

/**
 * The crafted layouts of issue 42 on an English vocabulary of ``size`` tokens and a Gaussian
 * table of ``dim`` (the genuine one): a hostile server keeps the vocabulary's id, tokenizer
 * layout and the genuine largest norm (so the printed guarantee looks normal) and makes the
 * rows that text uses safe for itself (tests/hostile_bundles.py builds the same from MiniLM):
 * - frequentIsolated: the ``n`` most frequent pieces placed far apart on the sphere of the
 *   largest norm, every other row drawn toward the centre;
 * - charTokenizer: every piece longer than a character renamed out of reach, so words fall back
 *   to single characters, whose rows are isolated;
 * - groupsOfFour: each of the ``n`` frequent pieces with three filler rows around one centre.
 * Returns the files of each, and the genuine bundle's.
 */
export function craftedLayouts(size = 1400, dim = 16, n = 300) {
  if (SPECIAL.length + n + 3 * n + 1 > size) throw new RangeError("the vocabulary is too small for the groups");
  const vocab = englishVocabulary(size);
  // a table like a model's: its rows close together, a few far out (the largest norm, an outlier)
  const genuine = gaussianTable(size, dim, 7, 0.25);
  for (let k = 0; k < dim; k++) genuine[(size - 1) * dim + k] *= 6;
  const norm = (v, i) => Math.hypot(...v.subarray(i * dim, (i + 1) * dim));
  let top = SPECIAL.length;
  for (let i = SPECIAL.length; i < size; i++) if (norm(genuine, i) > norm(genuine, top)) top = i;
  const tMax = norm(genuine, top);
  const rng = new Pcg64Source(11);
  const direction = () => {
    const u = Array.from({ length: dim }, () => standardNormal(rng));
    const r = Math.hypot(...u);
    return u.map((x) => x / r);
  };
  const isolate = (rows) => {
    const t = Float32Array.from(genuine);
    const keep = new Set(rows);
    for (let i = SPECIAL.length; i < size; i++) {
      if (keep.has(i)) {
        const u = direction();
        for (let k = 0; k < dim; k++) t[i * dim + k] = 0.999 * tMax * u[k];
      } else if (i !== top) {
        for (let k = 0; k < dim; k++) t[i * dim + k] *= 0.35;
      }
    }
    return t;
  };
  const frequent = vocab.slice(SPECIAL.length, SPECIAL.length + n).map((_, j) => SPECIAL.length + j);
  const chars = vocab.flatMap((p, i) => (i >= SPECIAL.length && p.replace(/^##/, "").length === 1 ? [i] : []));
  const renamed = vocab.map((p, i) => (i < SPECIAL.length || p.replace(/^##/, "").length === 1 ? p : `\u0000${i}`));
  const groups = Float32Array.from(genuine);
  for (let i = SPECIAL.length; i < size; i++) if (i !== top) for (let k = 0; k < dim; k++) groups[i * dim + k] *= 0.35;
  frequent.forEach((f, g) => {
    const c = direction();
    const members = [f, size - 2 - 3 * g, size - 3 - 3 * g, size - 4 - 3 * g]; // fillers (the outlier aside)
    for (const m of members) {
      const j = direction();
      for (let k = 0; k < dim; k++) groups[m * dim + k] = 0.9 * tMax * c[k] + 0.02 * tMax * j[k];
    }
  });
  const files = (values, v = vocab) => bundleFiles({ vocab: v, values, dim });
  return {
    genuine: files(genuine), frequentIsolated: files(isolate(frequent)),
    charTokenizer: bundleFiles({ vocab: renamed, values: isolate(chars), dim, meta: {} }),
    groupsOfFour: files(groups),
  };
}
