/**
 * The guarantee of a dχ privatization as the Python edge reports it (shared/accounting.py):
 * the published statement (η·d(x, x')-privacy per token, Qu et al. 2021 §3.2) next to what
 * holds between any two tokens of the table, ε = η·D per token with D = 2 max‖φ‖, summed over
 * a sentence's tokens.
 */

import { fmtG } from "../mechanisms/dchi.js";
import { message } from "../format/messages.js";

export interface Guarantee {
  mechanism: string;
  params: { eta: number };
  nominal: { eta: number; epsilon: null; statement: string };
  worst_case: { eta: number; epsilon: number; epsilon_scope: string; expected_noise_norm: number; dim: number };
  /** the privatization table's name (shared.table), where the bundle was given */
  table?: string;
}

export function guarantee(mechanism: "dchi-text" | "dchi-embedding", eta: number, diameter: number,
                          dim: number, table?: string | null): Guarantee {
  const g: Guarantee = {
    mechanism,
    params: { eta },
    nominal: { eta, epsilon: null, statement: message("DCHI_STATEMENT") },
    worst_case: { eta, epsilon: eta * diameter,
      epsilon_scope: message("DCHI_EPSILON_SCOPE"),
      expected_noise_norm: dim / eta, dim },
  };
  if (table) g.table = table;
  return g;
}

/** One line as shared.accounting.summary writes it; ``meanTokens`` adds a sentence's worst case. */
export function summary(g: Guarantee, meanTokens?: number | null): string {
  const wc = g.worst_case;
  let extra = `, worst eps ${wc.epsilon.toFixed(1)}/token`;
  if (meanTokens) {
    const sentence = Math.round(wc.epsilon * meanTokens).toLocaleString("en-US");
    extra += ` (${sentence} for a sentence of ${meanTokens.toFixed(1)} tokens)`;
  }
  const table = g.table ? ` (table ${g.table})` : "";
  return `${g.mechanism}: published eta=${fmtG(g.nominal.eta)}; holds eta=${fmtG(wc.eta)}${extra}${table}`;
}
