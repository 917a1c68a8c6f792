/**
 * The edge bundle (shared/bundle.py): `tokenizer.json`, `embeddings.npy`, optionally
 * `encoder.onnx`, and `bundle.json`, from a tarball (`GET /v1/bundles/{id}`) or any map of
 * file names to bytes. Every file is checked against its SHA-256 in `bundle.json`, and
 * `bundle_id` against the SHA-256 of the hashed metadata, before anything is used; a bundle
 * that fails is refused with a {@link BundleError} and never used.
 */

import { parseTar } from "nanotar";

import { BundleError } from "./errors.js";
import { readNpyF32 } from "./npy.js";
import { parseRaw, pyDumps, rawGet, type RawJson } from "./pyjson.js";
import { sha256Hex } from "./sha256.js";
import { measure, now } from "./timing.js";

export const FORMAT = "privbert-edge-bundle";
export const FORMAT_VERSION = 1;
export const TOKENIZER_FILE = "tokenizer.json";
export const EMBEDDINGS_FILE = "embeddings.npy";
export const ENCODER_FILE = "encoder.onnx";
export const META_FILE = "bundle.json";
const HASHED_META = ["format", "format_version", "vocab_size", "dim", "max_length", "special_ids",
  "unused_ids", "encoder", "files"];
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
  info?: unknown;
}

/** A verified bundle. */
export class EdgeBundle {
  /** Regular token ids: every id but the special and `[unused]` ones (what dχ-text returns). */
  readonly regularIds: Int32Array;

  constructor(
    readonly meta: BundleMeta,
    /** The word-embedding table, row-major float32 (vocab_size × dim). */
    readonly embeddings: Float32Array,
    readonly tokenizerJson: string,
    readonly encoderOnnx: Uint8Array | null,
  ) {
    const excluded = new Set<number>([...Object.values(meta.special_ids), ...meta.unused_ids]);
    const reg: number[] = [];
    for (let i = 0; i < meta.vocab_size; i++) if (!excluded.has(i)) reg.push(i);
    this.regularIds = Int32Array.from(reg);
  }

  private regular: Float32Array | null = null;
  private norms2: Float64Array | null = null;

  /** The rows of the regular tokens (row-major float32, made once and shared: the exact
   * search and the privacy floor read it in place). */
  get regularTable(): Float32Array {
    this.regular ??= this.rows(this.regularIds);
    return this.regular;
  }

  /** ‖φ(x)‖² of every row (float64 sums, in one pass, made once). */
  get rowNorms2(): Float64Array {
    if (this.norms2 === null) {
      const n = this.dim;
      const e = this.embeddings;
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

  /** max ‖φ(x)‖ over the regular tokens: half the diameter D of the worst-case guarantee
   * (ledger.diameter). */
  get regularMaxNorm(): number {
    const all = this.rowNorms2;
    let best = 0;
    for (const v of this.regularIds) if (all[v]! > best) best = all[v]!;
    return Math.sqrt(best);
  }

  /** max ‖φ(x)‖ over every row of the table. */
  get maxNorm(): number {
    let best = 0;
    for (const x of this.rowNorms2) if (x > best) best = x;
    return Math.sqrt(best);
  }

  get bundleId(): string {
    return this.meta.bundle_id;
  }

  get dim(): number {
    return this.meta.dim;
  }

  get vocabSize(): number {
    return this.meta.vocab_size;
  }

  get maxLength(): number {
    return this.meta.max_length;
  }

  /** The rows of ``ids`` of the table, row-major float32. */
  rows(ids: ArrayLike<number>): Float32Array {
    const n = this.dim;
    const out = new Float32Array(ids.length * n);
    for (let i = 0; i < ids.length;) {
      let j = i + 1; // a run of consecutive ids is one copy
      while (j < ids.length && ids[j] === ids[j - 1]! + 1) j++;
      out.set(this.embeddings.subarray(ids[i]! * n, (ids[j - 1]! + 1) * n), i * n);
      i = j;
    }
    return out;
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
      if (b === undefined) throw new BundleError(`${where}/${name}: missing`);
      return b;
    };
    let raw: RawJson;
    try {
      raw = parseRaw(new TextDecoder("utf-8", { fatal: true }).decode(await get(META_FILE)));
    } catch (exc) {
      if (exc instanceof BundleError) throw exc;
      throw new BundleError(`${where}/${META_FILE}: not valid JSON (${(exc as Error).message})`);
    }
    if (raw.kind !== "obj") throw new BundleError(`${where}/${META_FILE}: not a JSON object`);
    const meta = JSON.parse(pyDumps(raw)) as Record<string, unknown>;
    if (meta.format !== FORMAT || meta.format_version !== FORMAT_VERSION) {
      throw new BundleError(`${where}/${META_FILE}: not a ${FORMAT} v${FORMAT_VERSION} file`);
    }
    const files = meta.files;
    const vocab = meta.vocab_size;
    const dim = meta.dim;
    if (typeof files !== "object" || files === null || Array.isArray(files)
        || !Number.isInteger(vocab) || !Number.isInteger(dim)) {
      throw new BundleError(`${where}/${META_FILE}: lacks its files, vocab_size or dim`);
    }
    const blobs = new Map<string, Uint8Array>();
    for (const name of Object.keys(files).sort()) {
      const blob = await get(name);
      blobs.set(name, blob);
      if (await sha256Hex(blob) !== (files as Record<string, unknown>)[name]) {
        throw new BundleError(`${where}/${name}: content does not match its hash in ${META_FILE} `
          + "(corrupted or modified); fetch the bundle again");
      }
    }
    for (const required of [TOKENIZER_FILE, EMBEDDINGS_FILE]) {
      if (!blobs.has(required)) throw new BundleError(`${where}/${META_FILE}: does not list ${required}`);
    }
    const hashed: [string, RawJson][] = HASHED_META.map(
      (k) => [k, rawGet(raw, k) ?? { kind: "lit", value: null }]);
    const id = await sha256Hex(new TextEncoder().encode(pyDumps({ kind: "obj", entries: hashed })));
    if (meta.bundle_id !== id) {
      throw new BundleError(`${where}/${META_FILE}: bundle_id does not match the contents`);
    }
    if (expectedId != null && meta.bundle_id !== expectedId) {
      throw new BundleError(`${where}: bundle_id ${String(meta.bundle_id)} is not the expected ${expectedId}`);
    }
    const m = checkMeta(meta, where);
    let tokenizerJson: string;
    try {
      tokenizerJson = new TextDecoder("utf-8", { fatal: true }).decode(blobs.get(TOKENIZER_FILE)!);
    } catch {
      throw new BundleError(`${where}: unreadable ${TOKENIZER_FILE} (not UTF-8)`);
    }
    const emb = readNpyF32(blobs.get(EMBEDDINGS_FILE)!, `${where}/${EMBEDDINGS_FILE}`);
    if (emb.rows !== m.vocab_size || emb.cols !== m.dim) {
      throw new BundleError(`${where}/${EMBEDDINGS_FILE}: shape (${emb.rows}, ${emb.cols}) does not `
        + `match vocab_size x dim in ${META_FILE}`);
    }
    return new EdgeBundle(m, emb.data, tokenizerJson, blobs.get(ENCODER_FILE) ?? null);
  }
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
