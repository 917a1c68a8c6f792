/**
 * The dχ guarantee as the Python edge prints it (`shared.accounting.summary`): the published
 * η next to what holds, the worst case η·D per token with D = 2 max‖φ‖ over the bundle's
 * regular tokens (Qu et al. 2021 §3.2: no two tokens are further apart), and that worst case
 * summed over a sentence's tokens.
 */

/** Python's `format(x, "g")`: 6 significant digits, trailing zeros dropped. */
export function fmtG(x: number): string {
  if (!Number.isFinite(x)) return String(x);
  if (x === 0) return "0";
  const exp = Math.floor(Math.log10(Math.abs(x)));
  if (exp < -4 || exp >= 6) {
    const [m, e] = x.toExponential(5).split("e");
    const mant = m!.includes(".") ? m!.replace(/0+$/, "").replace(/\.$/, "") : m!;
    const n = Number(e);
    return `${mant}e${n < 0 ? "-" : "+"}${String(Math.abs(n)).padStart(2, "0")}`;
  }
  const s = x.toFixed(Math.max(0, 5 - exp));
  return s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s;
}

/** Python's `format(x, ",.0f")`. */
function grouped(x: number): string {
  return Math.round(x).toLocaleString("en-US", { maximumFractionDigits: 0 });
}

export interface DchiGuarantee {
  mechanism: string;
  eta: number;
  /** η·D: the worst case per token between any two tokens of the vocabulary. */
  worstPerToken: number;
  tokens: number;
}

/** The one line of `shared.accounting.summary(guarantee(mech, bundle), tokens)`. */
export function summaryLine(g: DchiGuarantee): string {
  let holds = `eta=${fmtG(g.eta)}, worst eps ${g.worstPerToken.toFixed(1)}/token`;
  if (g.tokens > 0) {
    holds += ` (${grouped(g.worstPerToken * g.tokens)} for a sentence of ${g.tokens.toFixed(1)} tokens)`;
  }
  return `${g.mechanism}: published eta=${fmtG(g.eta)}; holds ${holds}`;
}

/** The notes of `shared.accounting` that do not need neighbour distances. */
export function notes(g: DchiGuarantee, dim: number): string[] {
  const out = [
    `Two tokens at embedding distance d are eta*d = ${fmtG(g.eta)}*d indistinguishable; a sentence adds this over its tokens.`,
    "dχ-privacy is not ε-LDP: distant tokens are much easier to tell apart than close ones.",
  ];
  if (g.mechanism === "dchi-text") out.push("The nearest-token step is post-processing and keeps the guarantee.");
  out.push(`The expected noise norm n/eta = ${(dim / g.eta).toFixed(2)} (n = ${dim}).`);
  out.push(`Between the two most distant tokens the bound is eta*d <= ${g.worstPerToken.toFixed(1)} per token: read it as an LDP epsilon only with that number.`);
  return out;
}
