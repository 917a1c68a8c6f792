/**
 * The privatization table of a bundle (shared/table.py): the space in which `dchi-text` adds
 * its noise and searches the nearest regular token. Either the model's word embeddings
 * (`embeddings.npy`, the original layout), or a designed table (`table.npy`, described by the
 * `table` block of `bundle.json`): a PCA projection of the model's table, stored as float32 or
 * as int8 with one float32 scale per column (`table_scale.npy`). An int8 table *is* its
 * dequantized values float32(q) · scale, rounded once to float32 (the double product of an
 * int8 and a float32 is exact, so `Math.fround(q * s)` is numpy's value): noise and search
 * run over those, so the search is exact by construction.
 *
 * Read as shared/bundle.py's `_read_table` reads it, with its one-line messages.
 */

import { BundleError } from "../errors.js";
import { BUNDLE_FORMAT } from "../generated/spec.js";
import { message } from "../format/messages.js";
import { readNpy, type NpyFile } from "./npy.js";
import { rawGet, type RawJson } from "../format/pyjson.js";

export const TABLE_FILE: string = BUNDLE_FORMAT.files.table;
export const TABLE_SCALE_FILE: string = BUNDLE_FORMAT.files.table_scale;
const META_FILE: string = BUNDLE_FORMAT.files.meta;
const NPY_DTYPES = BUNDLE_FORMAT.npy_dtypes;

/** A designed privatization table, checked whole. */
export interface DesignedTable {
  /** vocab × dim float32, row-major: what the mechanism uses (an int8 table dequantized) */
  values: Float32Array;
  dim: number;
  dtype: "float32" | "int8";
  /** the `table` block of bundle.json (name, dim, dtype, projection, quantization, source,
   * file, scale_file), as plain values */
  info: Record<string, unknown>;
  /** the stored files, for the check that the bundle's id is reproduced from them */
  files: NpyFile[];
}

/** float32(q) · scale per column, one float32 rounding (shared.table.dequantize); a scale that
 * is not finite and > 0 in every column is refused. */
export function dequantize(q: Int8Array, scale: Float32Array): Float32Array {
  const k = scale.length;
  for (const s of scale) {
    if (!(Number.isFinite(s) && s > 0)) throw new RangeError("the table's scale must be finite and > 0 in every column");
  }
  const out = new Float32Array(q.length);
  for (let i = 0; i < q.length; i++) out[i] = Math.fround(q[i]! * scale[i % k]!);
  return out;
}

/** Python's repr of a JSON value as json.loads reads it (for the messages that quote one). */
export function pyRepr(v: RawJson | undefined): string {
  if (v === undefined) return "None";
  switch (v.kind) {
    case "lit":
      return v.value === null ? "None" : v.value ? "True" : "False";
    case "num":
      return v.text;
    case "str":
      return v.value.includes("'") && !v.value.includes('"') ? `"${v.value}"` : `'${v.value.replace(/'/g, "\\'")}'`;
    case "arr":
      return `[${v.items.map(pyRepr).join(", ")}]`;
    case "obj":
      return `{${v.entries.map(([k, x]) => `'${k}': ${pyRepr(x)}`).join(", ")}}`;
  }
}

/** Python's truth value of a JSON value (`if meta.get("table"):`). */
export function pyTruthy(v: RawJson | undefined): boolean {
  if (v === undefined) return false;
  switch (v.kind) {
    case "lit":
      return v.value === true;
    case "num":
      return Number(v.text) !== 0;
    case "str":
      return v.value !== "";
    case "arr":
      return v.items.length > 0;
    case "obj":
      return v.entries.length > 0;
  }
}

function plain(v: RawJson): unknown {
  switch (v.kind) {
    case "lit":
      return v.value;
    case "num":
      return Number(v.text);
    case "str":
      return v.value;
    case "arr":
      return v.items.map(plain);
    case "obj":
      return Object.fromEntries(v.entries.map(([k, x]) => [k, plain(x)]));
  }
}

/**
 * The designed table of ``info`` (the `table` block, raw) over ``vocab`` rows from the bundle's
 * ``blobs`` (already checked against their hashes): BundleError in one line, worded as
 * shared.bundle._read_table, for a block, dtype, shape or scale that does not fit.
 */
export function readTable(blobs: Map<string, Uint8Array>, info: RawJson, vocab: number, where: string): DesignedTable {
  if (info.kind !== "obj") throw new BundleError(message("BUNDLE_TABLE_BLOCK", { where, file: META_FILE }));
  const dtypeRaw = rawGet(info, "dtype");
  const dimRaw = rawGet(info, "dim");
  const dtype = dtypeRaw?.kind === "str" ? dtypeRaw.value : null;
  const dim = dimRaw?.kind === "num" && /^-?\d+$/.test(dimRaw.text) ? Number(dimRaw.text) : null;
  if ((dtype !== "float32" && dtype !== "int8") || dim === null || dim < 1) {
    throw new BundleError(message("BUNDLE_TABLE_KIND", { where, file: META_FILE, dtype: pyRepr(dtypeRaw),
      dim: pyRepr(dimRaw) }));
  }
  const file = rawGet(info, "file");
  if (file?.kind !== "str" || file.value !== TABLE_FILE) {
    throw new BundleError(message("BUNDLE_TABLE_FILE", { where, file: META_FILE, table_file: TABLE_FILE }));
  }
  const stored = readNpy(blobs.get(TABLE_FILE)!, TABLE_FILE, NPY_DTYPES[dtype], [vocab, dim], where);
  const files = [stored.file];
  let values: Float32Array;
  if (dtype === "int8") {
    const scaleFile = rawGet(info, "scale_file");
    if (scaleFile?.kind !== "str" || scaleFile.value !== TABLE_SCALE_FILE || !blobs.has(TABLE_SCALE_FILE)) {
      throw new BundleError(message("BUNDLE_TABLE_SCALE", { where, file: META_FILE, scale_file: TABLE_SCALE_FILE }));
    }
    const scale = readNpy(blobs.get(TABLE_SCALE_FILE)!, TABLE_SCALE_FILE, "<f4", [dim], where);
    files.push(scale.file);
    try {
      values = dequantize(stored.values as Int8Array, scale.values as Float32Array);
    } catch (exc) {
      throw new BundleError(`${where}/${TABLE_SCALE_FILE}: ${(exc as Error).message}`);
    }
  } else {
    values = stored.values as Float32Array;
    for (const x of values) {
      if (!Number.isFinite(x)) throw new BundleError(message("BUNDLE_TABLE_NON_FINITE", { where, file: TABLE_FILE }));
    }
  }
  return { values, dim, dtype, info: plain(info) as Record<string, unknown>, files };
}
