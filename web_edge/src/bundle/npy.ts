/**
 * The bundle's `.npy` files (NumPy format, as `numpy.save` writes them): `embeddings.npy`
 * (float32, vocab × n), `table.npy` (float32 or int8, vocab × k) and `table_scale.npy`
 * (float32, k). Checked as shared/bundle.py's `_read_npy` checks them, with its messages: the
 * dtype and the shape `bundle.json` describes. A file NumPy could read but would not write
 * back byte for byte (another header version or layout, Fortran order, trailing bytes) is
 * marked not canonical: the bundle's id could not be reproduced from it, and the bundle is
 * refused for that ({@link EdgeBundle.fromFiles}).
 */

import { BundleError } from "../errors.js";

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
const MAGIC = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59];
const ARRAY_ALIGN = 64; // numpy.lib.format.ARRAY_ALIGN

/** The dtypes a bundle stores, by their NumPy `dtype.str`. */
export type NpyDescr = "<f4" | "|i1";

/** An array file, parsed but not yet checked against what bundle.json says. */
export interface NpyFile {
  /** NumPy's `dtype.str` (byte order "|" for one-byte types) */
  descr: string;
  shape: number[];
  fortran: boolean;
  /** the data's bytes (a view into the file) */
  data: Uint8Array;
  /** whether `numpy.save` of the array gives these very bytes */
  canonical: boolean;
}

const ITEMSIZE: Record<string, number> = { b: 1, i: 0, u: 0, f: 0, c: 0 };

/** NumPy's name of a dtype string ("<f4" → float32), as `str(arr.dtype)` prints it. */
export function dtypeName(descr: string): string {
  const m = /^([<>|=])([biufc])(\d+)$/.exec(descr);
  if (!m) return descr;
  const [, order, kind, size] = m;
  const native = order === "|" || order === "=" || (order === "<") === LITTLE_ENDIAN;
  if (!native) return descr;
  if (kind === "b" && size === "1") return "bool";
  const bits = Number(size) * 8;
  return { i: `int${bits}`, u: `uint${bits}`, f: `float${bits}`, c: `complex${bits}` }[kind as "i"] ?? descr;
}

/** Python's repr of a shape tuple: "(3, 4)", "(4,)", "()". */
export function shapeRepr(shape: readonly number[]): string {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(", ")})`;
}

/** The header `numpy.save` writes (format 1.0) for a C-order array of ``descr`` and ``shape``. */
export function npyHeader(descr: string, shape: readonly number[]): Uint8Array {
  const dict = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shapeRepr(shape)}, }`;
  const hlen = dict.length + 1;
  const pad = ARRAY_ALIGN - ((6 + 2 + 2 + hlen) % ARRAY_ALIGN);
  const out = new Uint8Array(10 + hlen + pad);
  out.set(MAGIC);
  out[6] = 1;
  out[7] = 0;
  new DataView(out.buffer).setUint16(8, hlen + pad, true);
  for (let i = 0; i < dict.length; i++) out[10 + i] = dict.charCodeAt(i);
  out.fill(0x20, 10 + dict.length, out.length - 1);
  out[out.length - 1] = 0x0a;
  return out;
}

function unreadable(where: string, why: string): never {
  throw new BundleError(`${where}: not a readable .npy file (${why})`);
}

/** Parse a `.npy` file's header (BundleError "not a readable .npy file" as shared.bundle). */
export function parseNpy(bytes: Uint8Array, where: string): NpyFile {
  if (bytes.length < 10 || MAGIC.some((m, k) => bytes[k] !== m)) unreadable(where, "the magic string is not correct");
  const major = bytes[6]!;
  if (major < 1 || major > 3 || bytes[7] !== 0) unreadable(where, `unsupported format version ${major}.${bytes[7]}`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const lenSize = major === 1 ? 2 : 4;
  if (bytes.length < 8 + lenSize) unreadable(where, "truncated header");
  const headerLen = major === 1 ? view.getUint16(8, true) : view.getUint32(8, true);
  const start = 8 + lenSize + headerLen;
  if (start > bytes.length) unreadable(where, "truncated header");
  const header = new TextDecoder(major === 3 ? "utf-8" : "latin1").decode(bytes.subarray(8 + lenSize, start));
  let descr = /'descr':\s*'([^']*)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*(True|False)/.exec(header)?.[1];
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1];
  if (descr === undefined || fortran === undefined || shapeText === undefined) {
    unreadable(where, "the header is not a dict of descr, fortran_order and shape");
  }
  const parts = shapeText.split(",").map((s) => s.trim()).filter((s) => s !== "");
  if (!parts.every((s) => /^\d+$/.test(s))) unreadable(where, `shape (${shapeText}) is not a tuple of whole numbers`);
  const shape = parts.map(Number);
  const m = /^([<>|=])([a-zA-Z])(\d+)$/.exec(descr);
  if (!m || !(m[2]! in ITEMSIZE)) unreadable(where, `data type '${descr}' is not one a bundle stores`);
  if (m[3] === "1") descr = `|${m[2]}1`; // numpy: one-byte types have no byte order
  const itemsize = Number(m[3]);
  const count = shape.reduce((a, b) => a * b, 1);
  const nbytes = count * itemsize;
  if (bytes.length - start < nbytes) {
    unreadable(where, `${bytes.length - start} bytes of data for shape ${shapeRepr(shape)}`);
  }
  const want = npyHeader(descr, shape);
  const canonical = fortran === "False" && start === want.length && bytes.length === start + nbytes
    && want.every((b, k) => bytes[k] === b);
  return { descr, shape, fortran: fortran === "True", data: bytes.subarray(start, start + nbytes), canonical };
}

/**
 * The array ``name`` checked for its dtype and shape (shared.bundle._read_npy, its messages),
 * as float32 (``descr`` "<f4") or int8 ("|i1") values in C order, copied into an aligned buffer.
 */
export function readNpy(bytes: Uint8Array, name: string, descr: NpyDescr, shape: readonly number[],
                        where: string, meta = "bundle.json"): { values: Float32Array | Int8Array; file: NpyFile } {
  const f = parseNpy(bytes, `${where}/${name}`);
  if (f.descr !== descr) {
    throw new BundleError(`${where}/${name}: dtype ${dtypeName(f.descr)} is not the ${dtypeName(descr)} ${meta} describes`);
  }
  if (f.shape.length !== shape.length || f.shape.some((s, k) => s !== shape[k])) {
    throw new BundleError(`${where}/${name}: shape ${shapeRepr(f.shape)} does not match ${shapeRepr(shape)} in ${meta}`);
  }
  if (descr === "|i1") return { values: new Int8Array(f.data.slice().buffer), file: f }; // Fortran order: refused as not canonical
  const out = new Float32Array(f.data.length / 4);
  if (LITTLE_ENDIAN) {
    new Uint8Array(out.buffer).set(f.data);
  } else {
    const src = new DataView(f.data.buffer, f.data.byteOffset, f.data.byteLength);
    for (let i = 0; i < out.length; i++) out[i] = src.getFloat32(4 * i, true);
  }
  return { values: out, file: f };
}
