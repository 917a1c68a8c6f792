/**
 * Payloads on the wire (shared/payload.py): JSON with the mechanism, its parameters, the
 * bundle id and one array as base64 of little-endian bytes with an explicit dtype and shape.
 * There is no field that can hold raw text. The JSON is written byte for byte as the Python
 * edge writes it (orjson of the pydantic model: field order, float format), so the server
 * cannot tell the two edges apart and the conformance tests can compare bytes.
 */

import { MECHANISMS } from "../generated/spec.js";

export type FloatDtype = "float32" | "float16";

const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/** Standard padded base64 of ``bytes``. */
export function base64(bytes: Uint8Array): string {
  let out = "";
  let i = 0;
  for (; i + 2 < bytes.length; i += 3) {
    const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8) | bytes[i + 2]!;
    out += B64[n >>> 18]! + B64[(n >>> 12) & 63]! + B64[(n >>> 6) & 63]! + B64[n & 63]!;
  }
  const rest = bytes.length - i;
  if (rest === 1) {
    const n = bytes[i]! << 16;
    out += B64[n >>> 18]! + B64[(n >>> 12) & 63]! + "==";
  } else if (rest === 2) {
    const n = (bytes[i]! << 16) | (bytes[i + 1]! << 8);
    out += B64[n >>> 18]! + B64[(n >>> 12) & 63]! + B64[(n >>> 6) & 63]! + "=";
  }
  return out;
}

/** Bytes of standard padded base64 (strict: RangeError on anything else). */
export function fromBase64(text: string): Uint8Array {
  if (text.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(text)) throw new RangeError("not base64");
  const pad = text.endsWith("==") ? 2 : text.endsWith("=") ? 1 : 0;
  const out = new Uint8Array((text.length / 4) * 3 - pad);
  let o = 0;
  for (let i = 0; i < text.length; i += 4) {
    let n = 0;
    for (let k = 0; k < 4; k++) {
      const c = text[i + k]!;
      n = (n << 6) | (c === "=" ? 0 : B64.indexOf(c));
    }
    if (o < out.length) out[o++] = (n >>> 16) & 255;
    if (o < out.length) out[o++] = (n >>> 8) & 255;
    if (o < out.length) out[o++] = n & 255;
  }
  return out;
}

/** A float as orjson writes it: shortest round-trip digits, fixed notation for
 * 1e-5 ≤ |x| < 1e16 (whole numbers with ".0"), else "1e-7", "1.5e+16". */
export function orjsonFloat(x: number): string {
  if (!Number.isFinite(x)) throw new RangeError(`not a finite number: ${x}`);
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const a = Math.abs(x);
  if (a >= 1e-5 && a < 1e16) {
    const s = x.toFixed(20).includes("e") ? x.toString() : shortestFixed(x);
    return s.includes(".") ? s : `${s}.0`;
  }
  const [m, e] = x.toExponential().split("e") as [string, string];
  return `${m}e${e.startsWith("-") ? e : `+${e.replace("+", "")}`}`;
}

/** The shortest round-trip digits of ``x`` in fixed notation (x.toString() switches to
 * exponents below 1e-6). */
function shortestFixed(x: number): string {
  const s = x.toString();
  if (!s.includes("e")) return s;
  const [m, e] = x.toExponential().split("e") as [string, string];
  const exp = Number(e);
  const neg = m.startsWith("-");
  const digits = m.replace("-", "").replace(".", "");
  return `${neg ? "-" : ""}0.${"0".repeat(-exp - 1)}${digits}`;
}

/** Parameters that are integers on the wire (the spec's JSON Schema type "integer": OME's bit
 * layout, TextHide's m and k); every other number is a float (η = 65 is "65.0"). */
const INT_PARAMS: ReadonlySet<string> = new Set(MECHANISMS.flatMap((m) =>
  Object.entries(m.params.properties as Record<string, { type: string }>)
    .filter(([, p]) => p.type === "integer").map(([name]) => name)));
/** each mechanism's array field in its payload (shared.payload's, from the spec) */
const FIELD: Readonly<Record<string, string>> = Object.fromEntries(MECHANISMS.map((m) => [m.name, m.payload.field]));

/** JSON of a params object as the Python edge writes it, in the order given. */
export function paramsJson(params: Readonly<Record<string, number | string>>): string {
  const parts = Object.entries(params).map(([k, v]) =>
    `${JSON.stringify(k)}:${typeof v === "number" ? (INT_PARAMS.has(k) ? String(v) : orjsonFloat(v)) : JSON.stringify(v)}`);
  return `{${parts.join(",")}}`;
}

/** int32 little-endian bytes of ``ids``. */
export function int32Bytes(ids: ArrayLike<number>): Uint8Array {
  const out = new Uint8Array(ids.length * 4);
  const view = new DataView(out.buffer);
  for (let i = 0; i < ids.length; i++) view.setInt32(4 * i, ids[i]!, true);
  return out;
}

const F32 = new Float32Array(1);
const U32 = new Uint32Array(F32.buffer);

/** float32 → float16 bits, round to nearest even (numpy's astype). */
export function f16Bits(x: number): number {
  F32[0] = x;
  const b = U32[0]!;
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  const man = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (man ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    const m = man | 0x800000;
    const shift = 14 - e;
    let h = m >>> shift;
    const rem = m & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && (h & 1))) h++;
    return sign | h;
  }
  let h = (e << 10) | (man >>> 13);
  const rem = man & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1))) h++;
  return sign | h;
}

/** Little-endian bytes of float64 values cast to ``dtype`` (through float32, as the Python edge
 * casts); RangeError when a value is not finite after the cast. */
export function floatBytes(values: Float64Array | Float32Array, dtype: FloatDtype): Uint8Array {
  const size = dtype === "float32" ? 4 : 2;
  const out = new Uint8Array(values.length * size);
  const view = new DataView(out.buffer);
  for (let i = 0; i < values.length; i++) {
    const f = Math.fround(values[i]!);
    if (dtype === "float32") {
      if (!Number.isFinite(f)) throw new RangeError("arr contains NaN or Inf (after the cast to float32)");
      view.setFloat32(4 * i, f, true);
    } else {
      const h = f16Bits(f);
      if ((h & 0x7c00) === 0x7c00) throw new RangeError("arr contains NaN or Inf (after the cast to float16)");
      view.setUint16(2 * i, h, true);
    }
  }
  return out;
}

/** One array of a payload: its dtype, shape and little-endian bytes. */
export interface PayloadArray {
  dtype: string;
  shape: number[];
  bytes: Uint8Array;
}

/** The JSON of one payload of ``mechanism``: its array in the mechanism's field (the spec's),
 * with `segments` for a sentence pair's token payload; fields in the Python edge's order. */
export function payloadJson(mechanism: string, params: Readonly<Record<string, number | string>>, bundleId: string,
                            array: PayloadArray, segments: readonly number[] | null = null): string {
  const field = FIELD[mechanism];
  if (field === undefined) throw new RangeError(`no payload format for mechanism ${JSON.stringify(mechanism)}`);
  const seg = segments ? `"segments":[${segments.join(",")}],` : "";
  return `{"version":1,"bundle_id":${JSON.stringify(bundleId)},${seg}"mechanism":${JSON.stringify(mechanism)},`
    + `"params":${paramsJson(params)},"${field}":{"dtype":"${array.dtype}",`
    + `"shape":[${array.shape.join(",")}],"data":"${base64(array.bytes)}"}}`;
}

/** A JSONL record line around a payload's JSON (shared.payload.Record): no label field
 * without a label. */
export function recordLine(payloadJson: string, label: number | string | null): string {
  if (label === null) return `{"payload":${payloadJson}}\n`;
  return `{"payload":${payloadJson},"label":${JSON.stringify(label)}}\n`;
}
