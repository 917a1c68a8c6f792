/**
 * The notes `shared.accounting` prints under a dχ guarantee, for the page (the one-line
 * summary itself is the library's `summary`, as `shared.accounting.summary` writes it).
 */

import type { Guarantee } from "@privbert/edge";

/** Python's `format(x, "g")` for the η in a note. */
function g(x: number): string {
  return String(Number(x.toPrecision(6)));
}

export function notes(gu: Guarantee): string[] {
  const eta = gu.worst_case.eta;
  const out = [
    `Two tokens at embedding distance d are eta*d = ${g(eta)}*d indistinguishable; a sentence adds this over its tokens.`,
    "dχ-privacy is not ε-LDP: distant tokens are much easier to tell apart than close ones.",
  ];
  if (gu.policy) {
    out.push(`Token policy ${gu.policy.name}: its ${gu.policy.public_words} public words are sent as typed with `
      + `probability ${g(gu.policy.sent_unchanged)} and have no guarantee among themselves; the bound above is for `
      + "every other word.");
  }
  if (gu.mechanism === "dchi-text") out.push("The nearest-token step is post-processing and keeps the guarantee.");
  out.push(`The expected noise norm n/eta = ${gu.worst_case.expected_noise_norm.toFixed(2)} (n = ${gu.worst_case.dim}).`);
  out.push(`Between the two most distant tokens the bound is eta*d <= ${gu.worst_case.epsilon.toFixed(1)} per token: `
    + "read it as an LDP epsilon only with that number.");
  return out;
}
