/**
 * The refusals both edges word identically, formatted from shared/messages.py's templates as
 * the mechanism spec carries them (../generated/spec.ts): no sentence of them is written here.
 *
 * {@link format} is Python's ``str.format`` for the fields the templates use (the spec's
 * ``messages.format`` says which): ``{name}`` as is (a string, or a number as Python's str
 * writes it), ``{name:g}`` (%g: 6 significant digits), ``{name:.Ng}``, ``{name:,}`` (an
 * integer with thousands commas) and ``{{``/``}}``. Anything else, or a field without a value,
 * throws: a template changed in Python to a form this module does not know fails here first.
 */

import { MESSAGES, type MessageName } from "../generated/spec.js";
import { pyFloat } from "./pyjson.js";

export type FormatValue = string | number;

/** Python's ``format(x, "g")`` (6 significant digits) or ``format(x, ".{precision}g")``. */
export function fmtG(x: number, precision = 6): string {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0" : "0";
  const p = Math.max(precision, 1);
  const [mant, e] = x.toExponential(p - 1).split("e") as [string, string];
  const exp = Number(e);
  if (exp < -4 || exp >= p) {
    let m = mant.includes(".") ? mant.replace(/0+$/, "").replace(/\.$/, "") : mant;
    if (m === "-0") m = "0";
    return `${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  }
  const fixed = x.toFixed(Math.max(p - 1 - exp, 0));
  return fixed.includes(".") ? fixed.replace(/0+$/, "").replace(/\.$/, "") : fixed;
}

/** Python's f"{x:.2f}" for x ≥ 0: JS rounds an exact tie up, Python to the even digit (a tie
 * at two decimals is a double x with 8x an odd integer). */
function fixed2(x: number): string {
  const t = 8 * x;
  if (Number.isInteger(t) && t % 2 === 1) {
    const lo = Math.floor(x * 100); // exact: x * 100 = 12.5 t
    return ((lo % 2 === 0 ? lo : lo + 1) / 100).toFixed(2);
  }
  return x.toFixed(2);
}

/** shared.messages.pct: a share as the refusals write it, "100%" at 1, else two decimals. */
export function pct(p: number): string {
  return p >= 1 ? "100%" : `${fixed2(100 * p)}%`;
}

/** Python's ``format(n, ",")`` for an integer. */
function thousands(n: number): string {
  if (!Number.isInteger(n)) throw new RangeError(`{:,} takes an integer here, got ${n}`);
  const digits = String(Math.abs(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return n < 0 ? `-${digits}` : digits;
}

function field(name: string, spec: string | undefined, value: FormatValue | undefined): string {
  if (value === undefined) throw new RangeError(`message field {${name}} has no value`);
  if (spec === undefined) {
    if (typeof value === "string") return value;
    if (Number.isInteger(value)) return String(value); // Python's str(int)
    if (!Number.isFinite(value)) return Number.isNaN(value) ? "nan" : value > 0 ? "inf" : "-inf";
    return pyFloat(value); // Python's str(float)
  }
  if (typeof value !== "number") throw new RangeError(`message field {${name}:${spec}} takes a number, got a string`);
  if (spec === "g") return fmtG(value);
  if (spec === ",") return thousands(value);
  const g = /^\.(\d+)g$/.exec(spec);
  if (g) return fmtG(value, Number(g[1]));
  throw new RangeError(`message field {${name}:${spec}}: format spec ${JSON.stringify(spec)} is not one the web edge formats`);
}

/** ``template.format(**values)`` for the placeholder forms above. */
export function format(template: string, values: Readonly<Record<string, FormatValue>> = {}): string {
  return template.replace(/\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)(?::([^{}]*))?\}|[{}]/g,
    (whole, name: string | undefined, spec: string | undefined) => {
      if (whole === "{{") return "{";
      if (whole === "}}") return "}";
      if (name === undefined) throw new RangeError(`a lone ${whole} in message template ${JSON.stringify(template)}`);
      return field(name, spec, Object.prototype.hasOwnProperty.call(values, name) ? values[name] : undefined);
    });
}

/** The spec's template ``name`` formatted with ``values`` (shared.messages.NAME.format(...)). */
export function message(name: MessageName, values: Readonly<Record<string, FormatValue>> = {}): string {
  return format(MESSAGES[name], values);
}

/** shared.messages.weak_head: the head of every floor refusal (WEAK_HEAD with ``what``). */
export function weakHead(what: string): string {
  return message("WEAK_HEAD", { what });
}
