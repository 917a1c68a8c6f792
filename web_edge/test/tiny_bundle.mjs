// A tiny edge bundle written here, as shared/bundle.py saves one (tokenizer.json, embeddings.npy,
// bundle.json with its bundle_id), so that the CLI tests of npm test need no Python: a BERT
// WordPiece vocabulary of [PAD] [unused0-2] [UNK] [CLS] [SEP] [MASK] and `words` made-up words,
// and a random float32 table (normal, sd 0.5, seeded).
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { Pcg64Source } from "../dist/random/pcg64.js";
import { pyDumps } from "../dist/format/pyjson.js";
import { standardNormal } from "../dist/random/samplers.js";
import { sha256Hex } from "../dist/bundle/sha256.js";

const SPECIAL = ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/** The i-th made-up word: letters only, distinct ("ba", "bb", ...). */
export function word(i) {
  let s = "";
  let j = i;
  do {
    s = String.fromCharCode(97 + (j % 26)) + s;
    j = Math.floor(j / 26);
  } while (j > 0);
  return `b${s}`;
}

function npyF32(data, rows, cols) {
  let header = `{'descr': '<f4', 'fortran_order': False, 'shape': (${rows}, ${cols}), }`;
  const total = Math.ceil((10 + header.length + 1) / 64) * 64;
  header = header.padEnd(total - 10 - 1, " ") + "\n";
  const out = new Uint8Array(total + data.byteLength);
  out.set([0x93, ...new TextEncoder().encode("NUMPY"), 1, 0, header.length & 255, header.length >> 8], 0);
  out.set(new TextEncoder().encode(header), 10);
  out.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), total);
  return out;
}

/** Write the bundle into ``dir``; returns its bundle_id. */
export async function writeTinyBundle(dir, { words = 200, dim = 16, seed = 0, maxLength = 64 } = {}) {
  const vocab = [...SPECIAL, ...Array.from({ length: words }, (_, i) => word(i))];
  const id = (t) => vocab.indexOf(t);
  const special = (t) => ({ id: id(t), content: t, single_word: false, lstrip: false, rstrip: false,
    normalized: false, special: true });
  const tokenizer = {
    version: "1.0", truncation: null, padding: null,
    added_tokens: ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"].map(special),
    normalizer: { type: "BertNormalizer", clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: true },
    pre_tokenizer: { type: "BertPreTokenizer" },
    post_processor: { type: "BertProcessing", sep: ["[SEP]", id("[SEP]")], cls: ["[CLS]", id("[CLS]")] },
    decoder: { type: "WordPiece", prefix: "##", cleanup: true },
    model: { type: "WordPiece", unk_token: "[UNK]", continuing_subword_prefix: "##", max_input_chars_per_word: 100,
      vocab: Object.fromEntries(vocab.map((t, i) => [t, i])) },
  };
  const src = new Pcg64Source(seed);
  const table = Float32Array.from({ length: vocab.length * dim }, () => 0.5 * standardNormal(src));
  const files = {
    "tokenizer.json": new TextEncoder().encode(JSON.stringify(tokenizer)),
    "embeddings.npy": npyF32(table, vocab.length, dim),
  };
  const hashes = {};
  for (const [name, data] of Object.entries(files)) hashes[name] = await sha256Hex(data);
  const hashed = { format: "privbert-edge-bundle", format_version: 1, vocab_size: vocab.length, dim,
    max_length: maxLength, special_ids: { cls: id("[CLS]"), mask: id("[MASK]"), pad: id("[PAD]"), sep: id("[SEP]"), unk: id("[UNK]") },
    unused_ids: [1, 2, 3], encoder: null, files: hashes };
  const bundleId = await sha256Hex(new TextEncoder().encode(pyDumps(hashed)));
  mkdirSync(dir, { recursive: true });
  for (const [name, data] of Object.entries(files)) writeFileSync(join(dir, name), data);
  writeFileSync(join(dir, "bundle.json"), JSON.stringify({ bundle_id: bundleId, ...hashed, info: { source: "web_edge/test" } }, null, 2));
  return bundleId;
}
