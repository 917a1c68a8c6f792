/**
 * The edge bundle (shared/bundle.py): `tokenizer.json`, `bundle.json`, optionally
 * `encoder.onnx`, and the privatization table: either `embeddings.npy` (the model's word
 * embeddings, the original layout) or a designed table (`table.npy`, plus `table_scale.npy`
 * for int8: ./table.ts), from a tarball (`GET /v1/bundles/{id}`) or any map of file names to
 * bytes. Every file is checked against its SHA-256 in `bundle.json`, `bundle_id` against the
 * SHA-256 of the hashed metadata, the arrays against the dtype and shape it states, and the
 * whole against the id it reproduces, before anything is used; a bundle that fails is refused
 * with a {@link BundleError} and never used.
 */

import { parseTar } from "nanotar";

import { BundleError } from "../errors.js";
import { BUNDLE_FORMAT } from "../generated/spec.js";
import { message } from "../format/messages.js";
import { readNpy, type NpyFile } from "./npy.js";
import { parseRaw, pyDumps, rawGet, type RawJson } from "../format/pyjson.js";
import { pyTruthy, readTable, TABLE_FILE, TABLE_SCALE_FILE, type DesignedTable } from "./table.js";
import { sha256Hex } from "./sha256.js";
import { TokenPolicy, tokenizerVocab } from "./policy.js";
import { diameter } from "../ledger/exact.js";
import { measure, now } from "../timing.js";

// the format's names are shared.bundle's, read from the mechanism spec (shared/spec)
export const FORMAT: string = BUNDLE_FORMAT.format;
export const FORMAT_VERSION: number = BUNDLE_FORMAT.format_version;
export const TOKENIZER_FILE: string = BUNDLE_FORMAT.files.tokenizer;
export const EMBEDDINGS_FILE: string = BUNDLE_FORMAT.files.embeddings;
export const ENCODER_FILE: string = BUNDLE_FORMAT.files.encoder;
export const META_FILE: string = BUNDLE_FORMAT.files.meta;
const HASHED_META: readonly string[] = BUNDLE_FORMAT.hashed_meta;
/** absent from the original layout: its ids stay as they were */
const HASHED_IF_PRESENT: readonly string[] = BUNDLE_FORMAT.hashed_if_present;
const BUNDLE_ID = /^[0-9a-f]{64}$/;

/** What `bundle.json` says, read as plain values. */
export interface BundleMeta {
  bundle_id: string;
  vocab_size: number;
  dim: number;
  max_length: number;
  special_ids: Record<string, number>;
  unused_ids: number[];
  encoder: Record<string, unknown> | null;
  files: Record<string, string>;
  /** a designed privatization table's description (absent: the model's embeddings) */
  table?: Record<string, unknown> | null;
  /** the token policy's block (shared.policy: its name, source, size, tokens, sha256), if any */
  policy?: Record<string, unknown> | null;
  info?: unknown;
}

/** A verified bundle. */
export class EdgeBundle {
  /** Regular token ids: every id but the special and `[unused]` ones (what dχ-text returns). */
  readonly regularIds: Int32Array;
  /** The privatization table, row-major float32 (vocab_size × {@link tableDim}): the model's
   * word embeddings, or a designed table's (dequantized) values. */
  readonly table: Float32Array;
  /** Its dimension k (the model's {@link dim} in the original layout). */
  readonly tableDim: number;

  constructor(
    readonly meta: BundleMeta,
    /** The model's word-embedding table, row-major float32 (vocab_size × dim); null when the
     * bundle carries a designed privatization table instead. */
    private readonly modelEmbeddings: Float32Array | null,
    readonly tokenizerJson: string,
    readonly encoderOnnx: Uint8Array | null,
    /** a designed privatization table (./table.ts), else null */
    private readonly designed: DesignedTable | null = null,
    /** the token policy of `bundle.json`'s `policy` block (./policy.ts), checked; null: none */
    readonly policy: TokenPolicy | null = null,
  ) {
    if ((modelEmbeddings === null) === (designed === null)) {
      throw new BundleError(message("BUNDLE_EITHER_TABLE"));
    }
    this.table = designed?.values ?? modelEmbeddings!;
    this.tableDim = designed?.dim ?? meta.dim;
    this.regularIds = regularIdsOf(meta);
  }

  private regular: Float32Array | null = null;
  private norms2: Float64Array | null = null;
  private diam: number | null = null;

  /** Whether the bundle carries the model's own word embeddings (dchi-embedding needs them). */
  get hasEmbeddings(): boolean {
    return this.modelEmbeddings !== null;
  }

  /** The model's word embeddings (vocab × dim, float32); a BundleError (shared.bundle's
   * message) when the bundle carries a designed privatization table instead. */
  get embeddings(): Float32Array {
    if (this.modelEmbeddings === null) {
      throw new BundleError(message("TABLE_ONLY", { bundle_id12: this.bundleId.slice(0, 12), table: this.tableName,
        dim: this.tableDim }));
    }
    return this.modelEmbeddings;
  }

  /** The `table` block of bundle.json (for the original layout, the same fields describing the
   * model's own table), as shared.bundle's `table_info`. */
  get tableInfo(): Record<string, unknown> {
    if (this.designed !== null) return { ...this.designed.info };
    const info = (this.meta.info ?? {}) as { source?: unknown };
    return { name: "none", dim: this.dim, dtype: "float32", projection: { kind: "none" }, quantization: null,
      source: { model: info.source ?? null, dim: this.dim }, file: EMBEDDINGS_FILE };
  }

  get tableName(): string {
    return String(this.tableInfo.name);
  }

  /** One plain line: which table this is (shared.bundle's `describe_table`). */
  describeTable(): string {
    const info = this.tableInfo as { name: string; dim: number; dtype: string;
      projection?: { kind?: string; k?: number }; source?: { model?: string | null; dim?: number } };
    const src = info.source?.model || "the model";
    const what = info.projection?.kind === "none" ? `the model's ${info.dim}-d word embeddings`
      : `the top ${info.projection?.k} principal components of the model's ${info.source?.dim}-d word embeddings`;
    return `table ${info.name}: ${what} (${src}), ${info.dtype}`;
  }

  /** The rows of the regular tokens of the privatization table (row-major float32, made once
   * and shared: the exact search and the privacy floor read it in place). */
  get regularTable(): Float32Array {
    this.regular ??= this.tableRows(this.regularIds);
    return this.regular;
  }

  /** ‖φ(x)‖² of every row of the privatization table (float64 sums, in one pass, made once). */
  get rowNorms2(): Float64Array {
    if (this.norms2 === null) {
      const n = this.tableDim;
      const e = this.table;
      const out = new Float64Array(this.vocabSize);
      for (let v = 0; v < out.length; v++) {
        let s = 0;
        for (let k = v * n; k < (v + 1) * n; k++) s += e[k]! ** 2; // as ledger.diameter sums them
        out[v] = s;
      }
      this.norms2 = out;
    }
    return this.norms2;
  }

  /** ‖φ(x)‖² of the regular tokens, in {@link regularTable}'s order. */
  regularNorms2(): Float64Array {
    const all = this.rowNorms2;
    return Float64Array.from(this.regularIds, (v) => all[v]!);
  }

  /** max ‖φ(x)‖ over the regular tokens of the privatization table, from the plain float64 sums
   * (the floor's bound; the exact D of the ledger is {@link diameter}). */
  get regularMaxNorm(): number {
    const all = this.rowNorms2;
    let best = 0;
    for (const v of this.regularIds) if (all[v]! > best) best = all[v]!;
    return Math.sqrt(best);
  }

  /** The diameter D = 2 max‖φ(x)‖ over the regular tokens of the privatization table, exactly
   * as shared.accounting.bundle_diameter: what every dχ cost and worst-case guarantee is ηD of. */
  get diameter(): number {
    if (this.diam === null) this.diam = diameter(this.table, this.tableDim, this.regularIds, this.rowNorms2);
    return this.diam;
  }

  /** max ‖φ(x)‖ over every row of the privatization table. */
  get maxNorm(): number {
    let best = 0;
    for (const x of this.rowNorms2) if (x > best) best = x;
    return Math.sqrt(best);
  }

  get bundleId(): string {
    return this.meta.bundle_id;
  }

  /** The model's embedding dimension (bundle.json's `dim`). */
  get dim(): number {
    return this.meta.dim;
  }

  get vocabSize(): number {
    return this.meta.vocab_size;
  }

  get maxLength(): number {
    return this.meta.max_length;
  }

  /** The rows of ``ids`` of the model's word embeddings, row-major float32 (dchi-embedding;
   * BundleError for a bundle with a designed table). */
  rows(ids: ArrayLike<number>): Float32Array {
    return copyRows(this.embeddings, this.dim, ids);
  }

  /** The rows of ``ids`` of the privatization table, row-major float32. */
  tableRows(ids: ArrayLike<number>): Float32Array {
    return copyRows(this.table, this.tableDim, ids);
  }

  /** The bundle from its uncompressed tarball (what `GET /v1/bundles/{id}` serves). */
  static async fromTar(data: Uint8Array | ArrayBuffer, expectedId?: string | null): Promise<EdgeBundle> {
    const t0 = now();
    try {
      return await EdgeBundle.fromTarBytes(data, expectedId);
    } finally {
      measure("verify", t0);
    }
  }

  private static async fromTarBytes(data: Uint8Array | ArrayBuffer, expectedId?: string | null): Promise<EdgeBundle> {
    const buf = data instanceof ArrayBuffer ? data
      : data.byteOffset === 0 && data.byteLength === data.buffer.byteLength
        ? (data.buffer as ArrayBuffer)
        : (data.buffer as ArrayBuffer).slice(data.byteOffset, data.byteOffset + data.byteLength);
    const files = new Map<string, Uint8Array>();
    // a tar archive ends with two zero blocks: without them the download was cut short
    const tail = new Uint8Array(buf, Math.max(0, buf.byteLength - 1024));
    if (buf.byteLength < 1536 || buf.byteLength % 512 !== 0 || tail.some((b) => b !== 0)) {
      throw new BundleError("bundle tarball: truncated or not a tar archive (no end-of-archive marker)");
    }
    try {
      for (const item of parseTar(buf)) {
        if ((item.type === "file" || item.type === undefined) && item.size >= 0) {
          files.set(item.name, item.data ?? new Uint8Array(0));
        }
      }
    } catch (exc) {
      throw new BundleError(`bundle tarball: truncated or not a tar archive (${(exc as Error).message})`);
    }
    if (files.size === 0) throw new BundleError("bundle tarball: not a tar archive (no files in it)");
    return EdgeBundle.fromFiles((name) => files.get(name), "bundle tarball", expectedId);
  }

  /**
   * The bundle from a reader of its files (a tarball's, a directory's, a cache's): the checks
   * of `EdgeBundle._from_reader` in shared/bundle.py, with the same messages.
   */
  static async fromFiles(read: (name: string) => Uint8Array | undefined | Promise<Uint8Array | undefined>,
                         where: string, expectedId?: string | null): Promise<EdgeBundle> {
    const get = async (name: string): Promise<Uint8Array> => {
      const b = await read(name);
      if (b === undefined) throw new BundleError(message("BUNDLE_MISSING", { where, file: name }));
      return b;
    };
    let raw: RawJson;
    try {
      raw = parseRaw(new TextDecoder("utf-8", { fatal: true }).decode(await get(META_FILE)));
    } catch (exc) {
      if (exc instanceof BundleError) throw exc;
      throw new BundleError(`${where}/${META_FILE}: not valid JSON (${(exc as Error).message})`);
    }
    if (raw.kind !== "obj") throw new BundleError(message("BUNDLE_NOT_OBJECT", { where, file: META_FILE }));
    const meta = JSON.parse(pyDumps(raw)) as Record<string, unknown>;
    if (meta.format !== FORMAT || meta.format_version !== FORMAT_VERSION) {
      throw new BundleError(message("BUNDLE_NOT_FORMAT", { where, file: META_FILE, format: FORMAT, version: FORMAT_VERSION }));
    }
    const files = meta.files;
    const vocab = meta.vocab_size;
    const dim = meta.dim;
    if (typeof files !== "object" || files === null || Array.isArray(files)
        || !Number.isInteger(vocab) || !Number.isInteger(dim)) {
      throw new BundleError(message("BUNDLE_LACKS", { where, file: META_FILE }));
    }
    const blobs = new Map<string, Uint8Array>();
    for (const name of Object.keys(files).sort()) {
      const blob = await get(name);
      blobs.set(name, blob);
      if (await sha256Hex(blob) !== (files as Record<string, unknown>)[name]) {
        throw new BundleError(message("BUNDLE_HASH", { where, file: name, meta: META_FILE }));
      }
    }
    const tableRaw = rawGet(raw, "table");
    const designed = pyTruthy(tableRaw);
    for (const required of [TOKENIZER_FILE, designed ? TABLE_FILE : EMBEDDINGS_FILE]) {
      if (!blobs.has(required)) throw new BundleError(message("BUNDLE_UNLISTED", { where, file: META_FILE, required }));
    }
    const hashed: [string, RawJson][] = HASHED_META.map(
      (k) => [k, rawGet(raw, k) ?? { kind: "lit", value: null }]);
    for (const k of HASHED_IF_PRESENT) {
      const v = rawGet(raw, k);
      if (v !== undefined && !(v.kind === "lit" && v.value === null)) hashed.push([k, v]);
    }
    const id = await sha256Hex(new TextEncoder().encode(pyDumps({ kind: "obj", entries: hashed })));
    if (meta.bundle_id !== id) {
      throw new BundleError(message("BUNDLE_ID_MISMATCH", { where, file: META_FILE }));
    }
    if (expectedId != null && meta.bundle_id !== expectedId) {
      throw new BundleError(message("BUNDLE_NOT_EXPECTED", { where, bundle_id: String(meta.bundle_id), expected: expectedId }));
    }
    const m = checkMeta(meta, where);
    let tokenizerJson: string;
    try {
      tokenizerJson = new TextDecoder("utf-8", { fatal: true }).decode(blobs.get(TOKENIZER_FILE));
    } catch {
      throw new BundleError(`${where}: unreadable ${TOKENIZER_FILE} (not UTF-8)`);
    }
    let emb: Float32Array | null = null;
    let table: DesignedTable | null = null;
    let arrays: NpyFile[];
    if (designed) {
      table = readTable(blobs, tableRaw!, m.vocab_size, where);
      arrays = table.files;
    } else {
      const e = readNpy(blobs.get(EMBEDDINGS_FILE)!, EMBEDDINGS_FILE, "<f4", [m.vocab_size, m.dim], where);
      emb = e.values as Float32Array;
      arrays = [e.file];
    }
    // the token policy, checked whole (shared.bundle checks it as it builds the bundle, before
    // the id is reproduced): a list that is not public is refused in one line
    const policyRaw = rawGet(raw, "policy");
    let policy: TokenPolicy | null = null;
    if (policyRaw !== undefined && !(policyRaw.kind === "lit" && policyRaw.value === null)) {
      let vocab: Map<string, number>;
      try {
        vocab = tokenizerVocab(tokenizerJson);
      } catch (exc) {
        throw new BundleError(`${where}: unreadable ${TOKENIZER_FILE} (${(exc as Error).message})`);
      }
      policy = await TokenPolicy.fromBlock(policyRaw, vocab, regularIdsOf(m), META_FILE);
    }
    if (!reproducesId(Object.keys(files), arrays, tableRaw, table)) {
      throw new BundleError(message("BUNDLE_NOT_REPRODUCED", { where, bundle_id: m.bundle_id }));
    }
    return new EdgeBundle(m, emb, tokenizerJson, blobs.get(ENCODER_FILE) ?? null, table, policy);
  }
}

/** Regular token ids: every id below vocab_size but the special and `[unused]` ones. */
function regularIdsOf(meta: BundleMeta): Int32Array {
  const excluded = new Set<number>([...Object.values(meta.special_ids), ...meta.unused_ids]);
  const reg: number[] = [];
  for (let i = 0; i < meta.vocab_size; i++) if (!excluded.has(i)) reg.push(i);
  return Int32Array.from(reg);
}

/** Row ``ids`` of a row-major ``table`` of width ``n``, copied (a run of consecutive ids in one copy). */
function copyRows(table: Float32Array, n: number, ids: ArrayLike<number>): Float32Array {
  const out = new Float32Array(ids.length * n);
  for (let i = 0; i < ids.length;) {
    let j = i + 1;
    while (j < ids.length && ids[j] === ids[j - 1]! + 1) j++;
    out.set(table.subarray(ids[i]! * n, (ids[j - 1]! + 1) * n), i * n);
    i = j;
  }
  return out;
}

/**
 * Whether writing the bundle back as shared.bundle does (its files as numpy saves them, its
 * table block as the table describes itself) gives the same bundle_id: the files listed are
 * exactly the ones such a bundle has, each array file is numpy's bytes for its array, and the
 * table block is one shared.bundle writes (a float32 table has no scale file; a falsy block
 * that was hashed is dropped when written back, so it cannot reproduce the id).
 */
function reproducesId(listed: string[], arrays: NpyFile[], tableRaw: RawJson | undefined,
                      table: DesignedTable | null): boolean {
  const want = new Set([TOKENIZER_FILE]);
  if (table === null) want.add(EMBEDDINGS_FILE);
  else {
    want.add(TABLE_FILE);
    if (table.dtype === "int8") want.add(TABLE_SCALE_FILE);
  }
  if (listed.includes(ENCODER_FILE)) want.add(ENCODER_FILE);
  if (listed.length !== want.size || !listed.every((f) => want.has(f))) return false;
  if (!arrays.every((a) => a.canonical)) return false;
  if (table === null) return tableRaw === undefined || (tableRaw.kind === "lit" && tableRaw.value === null);
  return table.dtype === "int8" || rawGet(tableRaw!, "scale_file") === undefined;
}

/** The fields the edge reads, type-checked (the hash already proved they are the server's). */
function checkMeta(meta: Record<string, unknown>, where: string): BundleMeta {
  const ints = (v: unknown): v is number[] => Array.isArray(v) && v.every(Number.isInteger);
  const special = meta.special_ids as Record<string, unknown> | null;
  if (typeof meta.bundle_id !== "string" || !BUNDLE_ID.test(meta.bundle_id)
      || !Number.isInteger(meta.max_length) || !ints(meta.unused_ids)
      || typeof special !== "object" || special === null || !Object.values(special).every(Number.isInteger)) {
    throw new BundleError(`${where}/${META_FILE}: lacks bundle_id, max_length, special_ids or unused_ids`);
  }
  return meta as unknown as BundleMeta;
}

/** What the start of a bundle tarball declares (unverified: a hint, e.g. whether to start
 * onnxruntime-web while the rest downloads; the verified bundle decides everything). */
export interface BundleShape {
  /** rows (the vocabulary) and columns of the privatization table */
  rows: number;
  dim: number;
  /** the bundle has a sentence encoder (encoder.onnx) */
  encoder: boolean;
}

/**
 * The shape ``bundle.json`` declares, from the first ``loaded`` bytes of a bundle tarball
 * (bundle.json is its first file: the service writes the files sorted by name): null while
 * bundle.json has not fully arrived, undefined where the tarball does not start with it or it
 * does not parse (a hint only: nothing is refused here).
 */
export function peekBundleShape(head: Uint8Array, loaded: number): BundleShape | null | undefined {
  if (loaded < 512) return null;
  const text = (a: number, b: number): string => {
    let end = a;
    while (end < b && head[end] !== 0) end++;
    return new TextDecoder().decode(head.subarray(a, end));
  };
  if (text(0, 100) !== META_FILE) return undefined;
  const size = parseInt(text(124, 136).trim(), 8);
  if (!(size > 0) || size > 1 << 24) return undefined;
  if (loaded < 512 + size) return null;
  try {
    const meta = JSON.parse(text(512, 512 + size)) as { vocab_size?: unknown; dim?: unknown;
      table?: { dim?: unknown } | null; encoder?: unknown };
    const rows = Number(meta.vocab_size);
    const dim = Number(meta.table?.dim ?? meta.dim);
    if (!(Number.isInteger(rows) && rows > 0 && Number.isInteger(dim) && dim > 0)) return undefined;
    return { rows, dim, encoder: meta.encoder != null };
  } catch {
    return undefined;
  }
}
