/**
 * What the mechanism spec (../generated/spec.ts, written from the Python registry) says about a
 * mechanism, asked by name: its payload (array field, dtypes, rank; whether it carries tokens),
 * its parameters, which of them a payload shares with its model, its family. No mechanism is
 * named here: every answer is read from the spec, so the rest of the library (the forwarder, the
 * session, the floor, the ledger) treats a mechanism the spec publishes as the spec says.
 *
 * Light on purpose (it imports the spec only): the forwarder, a backend's handler, reads it
 * without the samplers and searches of ./registry.ts.
 */

import { FAMILIES, MECHANISMS, PARAM_RTOL, type MechanismName, type MechanismSpec } from "../generated/spec.js";

export type { MechanismName, MechanismSpec };

/** A parameter's JSON Schema, as pydantic publishes it in the spec: a type, or for an optional
 * parameter (`X | None`: absent from a payload that does not use it) `anyOf` X and null. */
export interface ParamSchema {
  type?: "number" | "integer" | "string" | "null";
  anyOf?: readonly ParamSchema[];
  enum?: readonly string[];
  default?: number | string | null;
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
}

/** ``schema`` with `X | None` read as X (`optional`: the parameter may be absent). */
export function plainSchema(schema: ParamSchema): ParamSchema & { optional: boolean } {
  if (schema.type !== undefined || schema.anyOf === undefined) return { ...schema, optional: false };
  const given = schema.anyOf.filter((s) => s.type !== "null");
  return { ...schema, ...(given.length === 1 ? given[0] : {}), anyOf: undefined, optional: true };
}

const BY_NAME: ReadonlyMap<string, MechanismSpec> = new Map(MECHANISMS.map((m) => [m.name, m]));

/** Every mechanism the spec publishes, in its order. */
export const SPEC_NAMES: readonly MechanismName[] = MECHANISMS.map((m) => m.name);

/** The spec of ``name``, or undefined for a name the spec does not publish. */
export function findSpec(name: string): MechanismSpec | undefined {
  return BY_NAME.get(name);
}

/** The spec of ``name``; RangeError for a name the spec does not publish. */
export function mechanismSpec(name: string): MechanismSpec {
  const m = BY_NAME.get(name);
  if (m === undefined) {
    throw new RangeError(`no mechanism ${JSON.stringify(name)} in the mechanism spec; one of ${SPEC_NAMES.join(", ")}`);
  }
  return m;
}

/** The JSON Schema of each of ``name``'s parameters, by parameter name. */
export function paramSchemas(name: string): Readonly<Record<string, ParamSchema>> {
  return mechanismSpec(name).params.properties;
}

// The questions below answer false for a name the spec does not publish (its refusal comes
// from whoever builds the mechanism: ./registry.ts).

/** Whether ``name``'s payload carries the text's word pieces (token ids or one row per token),
 * so that the model's length limit applies to it, and a sentence pair's `segments` with it. */
export function readsTokens(name: string): boolean {
  return findSpec(name)?.payload.reads_tokens ?? false;
}

/** Whether ``name``'s payload is a sentence vector of the bundle's encoder (encoder.onnx, run
 * on onnxruntime-web): every payload that does not carry the word pieces. */
export function usesEncoder(name: string): boolean {
  return findSpec(name)?.payload.reads_tokens === false;
}

/** Whether ``name``'s payload is token ids of other regular tokens (it can be read back as text). */
export function substitutesTokens(name: string): boolean {
  return findSpec(name)?.substitutes_tokens ?? false;
}

/** Whether ``name``'s payload holds rows of the model's own word embeddings (a designed
 * privatization table cannot serve it). */
export function sendsEmbeddings(name: string): boolean {
  return findSpec(name)?.payload.kind === "embeddings";
}

/** Whether ``name``'s budget family is a metric (dχ: η·d) one. */
export function isMetric(name: string): boolean {
  const family = findSpec(name)?.family;
  return FAMILIES.some((f) => f.name === family && f.metric);
}

/**
 * The predict length policy, the one place the web edge writes it
 * (edge_agent.privatize.run_setup.max_length_for with shared.bundle.EdgeBundle.length_for_model):
 * the length a run's texts are cut at, [CLS]/[SEP] included (the privatizer keeps
 * ``max_length − 2`` word pieces of a text, ``− 3`` of a pair). ``given`` (--max-length) when
 * set; else, for a run whose payloads go to a served model (``served``: its description; null
 * for any other run), a payload that carries word pieces is made within that model's own limit
 * (a model trained at 128 refuses longer ones, where the bundle allows up to 512), itself
 * within the bundle's ``bundleMaxLength``; a vector payload has one size whatever the text's
 * length (the encoder's limit applies). Null: no limit from the model (the bundle's, or the
 * encoder's, applies: the privatizer's default); a ``max_length`` that is not a length (an
 * integer >= 4) is none.
 */
export function predictMaxLength(name: string, given: number | null, bundleMaxLength: number,
                                 served: { max_length?: unknown } | null): number | null {
  if (given !== null || served === null || !readsTokens(name)) return given;
  const limit = served.max_length;
  if (typeof limit !== "number" || !Number.isInteger(limit) || limit < 4) return null;
  return Math.min(limit, bundleMaxLength);
}

/** Whether two values of a parameter agree (shared.mechanisms.registry.same_param: numbers
 * within the spec's relative tolerance, anything else equal). */
export function sameParam(a: unknown, b: unknown): boolean {
  if (typeof a === "number" && typeof b === "number") {
    return Math.abs(a - b) <= PARAM_RTOL * Math.max(Math.abs(a), Math.abs(b));
  }
  return a === b;
}

/** Whether a model that reads ``theirs`` takes payloads of ``name`` made with ``mine``: the
 * parameters the spec says a payload shares with its model, where both give them. */
export function sameParams(name: string, mine: Readonly<Record<string, unknown>>,
                           theirs: Readonly<Record<string, unknown>>): boolean {
  const compared: readonly string[] = mechanismSpec(name).compared_params;
  return compared.every((k) => !(k in mine) || !(k in theirs) || sameParam(mine[k], theirs[k]));
}
