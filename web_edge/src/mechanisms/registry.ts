/**
 * The web edge's mechanisms by name (transformers.js's name → class map): each one a module of
 * this folder ({@link MechanismModule}: its build and floor, privatize step, payload encoding,
 * cost, guarantee), keyed by its name in the mechanism spec. Everything else in the library asks
 * here, or the spec (./specs.ts), and names no mechanism.
 *
 * Adding a mechanism to the web edge: its module file, and one entry in {@link BUILT_IN}.
 * Mechanisms the spec publishes and the web edge does not implement are refused by
 * {@link mechanismModule} with a line that names the Python edge.
 */

import { message } from "../format/messages.js";
import type { MechanismName } from "../generated/spec.js";
import { dchiEmbedding } from "./dchi_embedding.js";
import { dchiText } from "./dchi_text.js";
import { laplace } from "./laplace.js";
import type { MechanismModule } from "./module.js";
import { ome } from "./ome.js";
import { SPEC_NAMES, findSpec } from "./specs.js";

/** The mechanisms the web edge implements. */
const BUILT_IN: readonly MechanismModule[] = [
  dchiText,
  dchiEmbedding,
  laplace,
  ome,
];

/** The mechanism a command line privatizes with when none is named (privbert-edge's
 * `--mechanism` default, as edge-agent's; web_edge/README.md). */
export const DEFAULT_MECHANISM: MechanismName = "dchi-text";

/** Why a mechanism of the spec stays in the Python edge, and the command that sends it. */
const ELSEWHERE: Readonly<Record<string, { why: string; use: string }>> = {
  texthide: {
    why: "mechanism texthide stays in the Python edge (edge-agent): it has no differential-privacy guarantee "
      + "and needs a secret mask pool",
    use: "edge-agent privatize --mechanism texthide",
  },
  none: { why: `${message("NONE_REFUSED")}; the web edge does not send it`, use: "edge-agent privatize --allow-none" },
};

const MODULES: ReadonlyMap<string, MechanismModule> = (() => {
  const map = new Map<string, MechanismModule>();
  for (const m of BUILT_IN) {
    if (findSpec(m.name) === undefined) throw new Error(`mechanism module ${m.name}: not in the mechanism spec (python -m shared.spec)`);
    if (map.has(m.name)) throw new Error(`mechanism module ${m.name} registered twice`);
    map.set(m.name, m);
  }
  return map;
})();

/** The web edge's mechanisms, in the spec's order. */
export function mechanismNames(): MechanismName[] {
  return SPEC_NAMES.filter((n) => MODULES.has(n));
}

/**
 * Null for a mechanism the web edge implements (or one the spec does not know); for one the spec
 * publishes and the web edge leaves to the Python edge, the refusal: for the command line
 * (``"cli"``: it starts with the flag) or for a program.
 */
export function refusal(name: string, audience: "api" | "cli" = "api"): string | null {
  if (MODULES.has(name) || findSpec(name) === undefined) return null;
  const e = ELSEWHERE[name] ?? { why: `mechanism ${name} is not in the web edge`, use: `edge-agent privatize --mechanism ${name}` };
  return `${audience === "cli" ? "--" : ""}${e.why}; use ${e.use}`;
}

/** The module of ``name``; RangeError (the refusal, or the mechanisms there are) for any other. */
export function mechanismModule(name: string): MechanismModule {
  const m = MODULES.get(name);
  if (m !== undefined) return m;
  throw new RangeError(refusal(name)
    ?? `no payload format for mechanism ${JSON.stringify(name)}; one of ${mechanismNames().join(", ")}`);
}
