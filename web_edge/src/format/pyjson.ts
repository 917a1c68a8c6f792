/**
 * JSON as Python's `json.dumps(obj, sort_keys=True, separators=(",", ":"))` writes it (ASCII
 * only, every other character escaped), for the two hashes the contract computes over JSON:
 * `bundle_id` (shared.bundle: SHA-256 of the hashed metadata) and the memo key's setting prefix.
 *
 * Numbers keep the literal text they had in the document they were read from
 * ({@link parseRaw}): Python wrote them (its float repr), so writing them back gives Python's
 * bytes; numbers made here are written as Python writes ints and floats ({@link pyFloat}).
 */

export type RawJson =
  | { kind: "num"; text: string }
  | { kind: "str"; value: string }
  | { kind: "lit"; value: true | false | null }
  | { kind: "arr"; items: RawJson[] }
  | { kind: "obj"; entries: [string, RawJson][] };

/** Parse JSON text keeping each number's literal text. Throws SyntaxError on bad JSON. */
export function parseRaw(text: string): RawJson {
  let i = 0;
  const ws = (): void => {
    while (i < text.length && " \t\n\r".includes(text[i]!)) i++;
  };
  const fail = (what: string): never => {
    throw new SyntaxError(`${what} at position ${i}`);
  };
  const value = (): RawJson => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const entries: [string, RawJson][] = [];
      ws();
      if (text[i] === "}") {
        i++;
        return { kind: "obj", entries };
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail("expected a key");
        const key = str();
        ws();
        if (text[i] !== ":") fail("expected ':'");
        i++;
        entries.push([key, value()]);
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "}") {
          i++;
          return { kind: "obj", entries };
        }
        fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      i++;
      const items: RawJson[] = [];
      ws();
      if (text[i] === "]") {
        i++;
        return { kind: "arr", items };
      }
      for (;;) {
        items.push(value());
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "]") {
          i++;
          return { kind: "arr", items };
        }
        fail("expected ',' or ']'");
      }
    }
    if (c === '"') return { kind: "str", value: str() };
    for (const [word, v] of [["true", true], ["false", false], ["null", null]] as const) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return { kind: "lit", value: v };
      }
    }
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    if (!m) fail("unexpected character");
    i += m![0].length;
    return { kind: "num", text: m![0] };
  };
  const str = (): string => {
    const start = i;
    i++;
    for (;;) {
      const c = text[i];
      if (c === undefined) fail("unterminated string");
      if (c === "\\") i += 2;
      else if (c === '"') break;
      else i++;
    }
    i++;
    return JSON.parse(text.slice(start, i)) as string;
  };
  const out = value();
  ws();
  if (i !== text.length) fail("trailing data");
  return out;
}

/** A JSON string literal as Python's json.dumps writes it: with ``ascii`` (its default,
 * ensure_ascii) every character outside printable ASCII escaped, else only the quote, the
 * backslash and the control characters. */
export function pyString(s: string, ascii = true): string {
  let out = '"';
  for (let k = 0; k < s.length; k++) {
    const c = s.charCodeAt(k);
    if (c === 0x22) out += '\\"';
    else if (c === 0x5c) out += "\\\\";
    else if (c === 0x0a) out += "\\n";
    else if (c === 0x0d) out += "\\r";
    else if (c === 0x09) out += "\\t";
    else if (c === 0x08) out += "\\b";
    else if (c === 0x0c) out += "\\f";
    else if (c < 0x20 || (ascii && c > 0x7e)) out += "\\u" + c.toString(16).padStart(4, "0");
    else out += s[k];
  }
  return out + '"';
}

/** A list of strings as Python's json.dumps(ensure_ascii=False, separators=(",", ":")) writes
 * it (shared.policy's digest). */
export function jsonDumpsUnicode(items: readonly string[]): string {
  return "[" + items.map((s) => pyString(s, false)).join(",") + "]";
}

/** Characters Python's str.isprintable() calls not printable (besides the ASCII space): Unicode
 * categories Cc, Cf, Cs, Co, Cn, Zl, Zp, Zs. */
const NOT_PRINTABLE = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]$/u;

/** Python's repr of a str: single quotes unless it holds one and no double quote, the quote and
 * the backslash escaped, \t \n \r, other unprintable characters as \xhh, \uhhhh or \Uhhhhhhhh. */
export function pyStrRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (ch === quote || ch === "\\") out += "\\" + ch;
    else if (ch === "\t") out += "\\t";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (c < 0x20 || c === 0x7f) out += "\\x" + c.toString(16).padStart(2, "0");
    else if (c < 0x7f || (c !== 0x20 && !NOT_PRINTABLE.test(ch))) out += ch;
    else if (c <= 0xff) out += "\\x" + c.toString(16).padStart(2, "0");
    else if (c <= 0xffff) out += "\\u" + c.toString(16).padStart(4, "0");
    else out += "\\U" + c.toString(16).padStart(8, "0");
  }
  return out + quote;
}

/** A float as Python's repr writes it (shortest round-trip digits; "65.0", "1e-05", "inf"
 * is refused: JSON has no infinities). */
export function pyFloat(x: number): string {
  if (!Number.isFinite(x)) throw new RangeError(`not a finite number: ${x}`);
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const [mant, expText] = x.toExponential().split("e") as [string, string];
  const exp = Number(expText);
  const neg = mant.startsWith("-");
  const digits = mant.replace("-", "").replace(".", "");
  const sign = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    const e = Math.abs(exp).toString().padStart(2, "0");
    return `${sign}${m}e${exp < 0 ? "-" : "+"}${e}`;
  }
  if (exp < 0) return `${sign}0.${"0".repeat(-exp - 1)}${digits}`;
  if (digits.length <= exp + 1) return `${sign}${digits}${"0".repeat(exp + 1 - digits.length)}.0`;
  return `${sign}${digits.slice(0, exp + 1)}.${digits.slice(exp + 1)}`;
}

/** Plain values as Python's json.dumps(sort_keys=True, separators=(",", ":")) writes them:
 * integers (Number.isSafeInteger and not marked float) as ints, other numbers as floats. */
export type PyValue = null | boolean | string | number | PyFloat | PyValue[] | { [k: string]: PyValue };

/** A number that Python holds as a float even when it is whole (η = 65 is "65.0"). */
export class PyFloat {
  constructor(readonly value: number) {}
}

export function pyDumps(v: PyValue | RawJson): string {
  if (v instanceof PyFloat) return pyFloat(v.value);
  if (v === null) return "null";
  if (typeof v === "boolean") return v ? "true" : "false";
  if (typeof v === "string") return pyString(v);
  if (typeof v === "number") return Number.isSafeInteger(v) ? String(v) : pyFloat(v);
  if (Array.isArray(v)) return "[" + v.map((x) => pyDumps(x)).join(",") + "]";
  if (isRaw(v)) return rawDumps(v);
  const keys = Object.keys(v).sort(compareCodePoints);
  return "{" + keys.map((k) => pyString(k) + ":" + pyDumps(v[k]!)).join(",") + "}";
}

function isRaw(v: object): v is RawJson {
  return "kind" in v && typeof v.kind === "string"
    && ["num", "str", "lit", "arr", "obj"].includes((v as { kind: string }).kind)
    && Object.keys(v).length === 2;
}

function rawDumps(v: RawJson): string {
  switch (v.kind) {
    case "num":
      return v.text;
    case "str":
      return pyString(v.value);
    case "lit":
      return v.value === null ? "null" : v.value ? "true" : "false";
    case "arr":
      return "[" + v.items.map(rawDumps).join(",") + "]";
    case "obj": {
      const e = [...v.entries].sort((a, b) => compareCodePoints(a[0], b[0]));
      return "{" + e.map(([k, x]) => pyString(k) + ":" + rawDumps(x)).join(",") + "}";
    }
  }
}

/** Python's str ordering (by code point), not UTF-16 code units. */
export function compareCodePoints(a: string, b: string): number {
  const x = Array.from(a, (c) => c.codePointAt(0)!);
  const y = Array.from(b, (c) => c.codePointAt(0)!);
  for (let k = 0; k < Math.min(x.length, y.length); k++) {
    if (x[k] !== y[k]) return x[k]! - y[k]!;
  }
  return x.length - y.length;
}

/** The member ``key`` of a raw JSON object (undefined when absent or not an object). */
export function rawGet(v: RawJson, key: string): RawJson | undefined {
  if (v.kind !== "obj") return undefined;
  let found: RawJson | undefined;
  for (const [k, x] of v.entries) if (k === key) found = x; // the last one wins, as Python's
  return found;
}
