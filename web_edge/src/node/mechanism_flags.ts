/**
 * The mechanism flags of `privbert-edge privatize`, from the mechanism spec
 * (../generated/spec.ts), as edge_agent/mechanism_spec.py derives `edge-agent privatize`'s: one
 * flag per parameter of a mechanism's typed `Params` (`--word-dropout` for `word_dropout`) with
 * its JSON type, choices, default and help, shared by every mechanism that has the parameter.
 * No mechanism parameter is listed here by hand; the web edge's own list is which mechanisms
 * it implements (../mechanisms/registry.ts).
 */

import { MECHANISMS as SPECS, type MechanismSpec } from "../generated/spec.js";
import type { Mechanism } from "../mechanisms/privatizer.js";
import { mechanismNames } from "../mechanisms/registry.js";

type Flag = MechanismSpec["flags"][number];

/** One flag for a parameter name, over every web-edge mechanism that has it. */
export interface ParamFlag {
  param: string;
  /** without the leading dashes: "word-dropout" */
  name: string;
  type: "number" | "integer" | "string";
  choices: readonly string[] | null;
  metavar: string;
  /** "<mechanism>, <mechanism>: <help>" (mechanisms with the same help share a clause) */
  help: string;
}

/** The spec of each mechanism the web edge implements, in the spec's order. */
export const WEB_SPECS: readonly MechanismSpec[] = SPECS.filter((m) => (mechanismNames() as readonly string[]).includes(m.name));

export function spec(mechanism: Mechanism): MechanismSpec {
  return WEB_SPECS.find((m) => m.name === mechanism)!;
}

const flagsOf = (m: MechanismSpec): readonly Flag[] => m.flags;
const dashed = (param: string): string => param.replaceAll("_", "-");

/** The parameter flags of the web edge's mechanisms, in the order the parameters first appear;
 * an Error when two mechanisms give one parameter different types (one flag cannot take both). */
export function paramFlags(): ParamFlag[] {
  const by = new Map<string, { flag: Flag; helps: [string, string][] }>();
  for (const m of WEB_SPECS) {
    for (const f of flagsOf(m)) {
      const got = by.get(f.param);
      if (got === undefined) {
        by.set(f.param, { flag: f, helps: [[m.name, f.help]] });
        continue;
      }
      if (got.flag.type !== f.type || JSON.stringify(got.flag.choices) !== JSON.stringify(f.choices)) {
        throw new Error(`parameter ${f.param} of ${m.name} has another type than that of ${got.helps[0]![0]}`);
      }
      got.helps.push([m.name, f.help]);
    }
  }
  return [...by.values()].map(({ flag, helps }) => {
    const groups = new Map<string, string[]>();
    for (const [mech, text] of helps) groups.set(text, [...(groups.get(text) ?? []), mech]);
    return {
      param: flag.param, name: dashed(flag.param), type: flag.type, choices: flag.choices,
      metavar: flag.choices ? flag.choices.join("|") : flag.metavar ?? flag.param.toUpperCase(),
      help: [...groups].map(([text, mechs]) => `${mechs.join(", ")}: ${text}`).join("; "),
    };
  });
}

/** The flags (dashed) that configure ``mechanism``: its parameters and its edge options
 * (edge_agent.privatize.options.mechanism_flags); any other one given is a usage error. */
export function mechanismFlags(mechanism: Mechanism): string[] {
  const m = spec(mechanism);
  return [...flagsOf(m).map((f) => f.param), ...m.edge_options].map(dashed);
}

/** The parameters ``mechanism`` cannot run without (required, and no edge default). */
export function neededParams(mechanism: Mechanism): string[] {
  return flagsOf(spec(mechanism)).filter((f) => f.required && f.edge_default === null).map((f) => f.param);
}

/** ``mechanism``'s parameters in the spec's order: each given value, else its default (the
 * Params' own, else the edge's). */
export function mechanismParams(mechanism: Mechanism, given: Readonly<Record<string, number | string>>
): Record<string, number | string> {
  const out: Record<string, number | string> = {};
  for (const f of flagsOf(spec(mechanism))) {
    const v = given[f.param] ?? (f.default as number | string | null) ?? (f.edge_default);
    if (v !== null && v !== undefined) out[f.param] = v;
  }
  return out;
}

/** The usage lines of the mechanisms: mechanisms with the same flags share one alternative,
 * the default's (``dflt``) with ``[--mechanism ...]``. */
export function usageAlternatives(dflt: Mechanism): string[] {
  const groups = new Map<string, string[]>();
  for (const m of WEB_SPECS) {
    const line = flagsOf(m).map((f) => {
      const meta = f.choices ? f.choices.join("|") : f.metavar ?? f.param.toUpperCase();
      const text = `--${dashed(f.param)} ${meta}`;
      return f.required ? text : `[${text}]`;
    }).join(" ");
    groups.set(line, [...(groups.get(line) ?? []), m.name]);
  }
  return [...groups].map(([line, mechs]) => {
    const mech = `--mechanism ${mechs.join("|")}`;
    return `${mechs.includes(dflt) ? `[${mech}]` : mech} ${line}`;
  });
}
