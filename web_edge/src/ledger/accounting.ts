/**
 * The guarantee of a privatization as the Python edge reports it (shared/accounting.py): what
 * is published next to what holds.
 *
 * - A metric (dχ) mechanism: the published statement (η·d(x, x')-privacy per token, Qu et al.
 *   2021 §3.2) next to what holds between any two tokens of the table, ε = η·D per token with
 *   D = 2 max‖φ‖, summed over a sentence's tokens ({@link guarantee}). Under a token policy
 *   (SanText+, Yue et al. 2021) it covers the words outside the public list only, and says so:
 *   the public words are sent unchanged with probability 1 − p and have no guarantee.
 * - A mechanism with an ε per payload: the published ε next to the worst case the ledger
 *   charges ({@link epsilonGuarantee}; DPNR's word dropout publishes ε′ of Lyu et al. 2020,
 *   Theorem 2: {@link dropoutEpsilon}).
 */

import { fmtG, message } from "../format/messages.js";

/** What a dχ guarantee says of a token policy (shared.accounting's `policy` block). */
export interface PolicyClause {
  name: string;
  /** how many words the public list holds */
  public_words: number;
  /** the probability that a public word is privatized anyway */
  p: number;
  /** 1 − p: the probability that a public word is sent as typed */
  sent_unchanged: number;
  sha256: string;
}

/** The guarantee of a metric (dχ) privatization. */
export interface Guarantee {
  mechanism: string;
  params: { eta: number; public_p?: number };
  nominal: { eta: number; epsilon: null; statement: string };
  worst_case: { eta: number; epsilon: number; epsilon_scope: string; expected_noise_norm: number; dim: number };
  /** the privatization table's name (shared.table), where the bundle was given */
  table?: string;
  /** the token policy it is made under, if any: the guarantee covers the other words */
  policy?: PolicyClause;
}

/** The guarantee of a privatization with an ε per payload (a sentence vector, bits). */
export interface EpsilonGuarantee {
  mechanism: string;
  params: Record<string, number | string>;
  /** what is published (null: no differential-privacy ε) */
  nominal: { epsilon: number | null };
  /** what holds between any two inputs: what the device ledger charges per payload */
  worst_case: { epsilon: number | null };
  table?: string;
}

/** Any guarantee {@link summary} writes. */
export type AnyGuarantee = Guarantee | EpsilonGuarantee;

/** The guarantee of dχ at ``eta`` over a table of diameter ``diameter`` and ``dim`` columns;
 * ``policy``: the token policy it is made under (its list and p), if any. */
export function guarantee(mechanism: string, eta: number, diameter: number,
                          dim: number, table?: string | null,
                          policy?: { name: string; size: number; sha256: string; p: number } | null): Guarantee {
  const g: Guarantee = {
    mechanism,
    params: policy ? { eta, public_p: policy.p } : { eta },
    nominal: { eta, epsilon: null, statement: message("DCHI_STATEMENT") },
    worst_case: { eta, epsilon: eta * diameter,
      epsilon_scope: message(policy ? "DCHI_POLICY_SCOPE" : "DCHI_EPSILON_SCOPE"),
      expected_noise_norm: dim / eta, dim },
  };
  if (table) g.table = table;
  if (policy) {
    g.policy = { name: policy.name, public_words: policy.size, p: policy.p, sent_unchanged: 1 - policy.p,
      sha256: policy.sha256 };
  }
  return g;
}

/** A guarantee with a published and a worst-case ε per payload. */
export function epsilonGuarantee(mechanism: string, params: Readonly<Record<string, number | string>>,
                                 published: number | null, worst: number | null): EpsilonGuarantee {
  return { mechanism, params: { ...params }, nominal: { epsilon: published }, worst_case: { epsilon: worst } };
}

/** ε′ = ln((1 − μ)e^ε + μ): ε after word dropout at rate μ, between inputs that differ in one
 * dropped word (Lyu et al. 2020, DPNR Theorem 2; shared.mechanisms.laplace.dropout_epsilon),
 * written so that a large ε does not overflow. */
export function dropoutEpsilon(epsilon: number, mu: number): number {
  return epsilon + Math.log((1 - mu) + mu * Math.exp(-epsilon));
}

function isMetric(g: AnyGuarantee): g is Guarantee {
  return typeof (g.worst_case as { eta?: unknown }).eta === "number";
}

/** One line as shared.accounting.summary writes it; ``meanTokens`` adds a sentence's worst
 * case (dχ). Takes every guarantee the library returns (`session.guarantee` included). */
export function summary(g: AnyGuarantee, meanTokens?: number | null): string {
  const table = g.table ? ` (table ${g.table})` : "";
  if (!isMetric(g)) {
    const eps = (x: number | null): string => (x === null ? "none" : `eps=${fmtG(x, 4)}`);
    return `${g.mechanism}: published ${eps(g.nominal.epsilon)}; holds ${eps(g.worst_case.epsilon)}${table}`;
  }
  const wc = g.worst_case;
  let extra = `, worst eps ${wc.epsilon.toFixed(1)}/token`;
  if (meanTokens) {
    const sentence = Math.round(wc.epsilon * meanTokens).toLocaleString("en-US");
    extra += ` (${sentence} for a sentence of ${meanTokens.toFixed(1)} tokens${g.policy ? " outside the public list" : ""})`;
  }
  const pol = g.policy;
  const policy = pol ? " " + message("DCHI_POLICY_CLAUSE", { size: pol.public_words, policy: pol.name,
    keep: pol.sent_unchanged }) : "";
  return `${g.mechanism}: published eta=${fmtG(g.nominal.eta)}; holds eta=${fmtG(wc.eta)}${extra}${table}${policy}`;
}
