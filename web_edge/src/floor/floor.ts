/**
 * The privacy floor of shared/floor.py for dχ-privacy: parameters that leave the output
 * (nearly) the raw input are refused, by the same rule and with the same message as the
 * Python edge. Unit = token: the share of regular tokens, drawn uniformly, that the mechanism
 * returns unchanged. Threshold τ = 0.97 (docs/privacy.md says why). Every constant below and
 * every refusal is shared.floor's, read from the mechanism spec (../generated/spec.ts) and worded
 * by shared/messages.py's templates (../format/messages.ts); the numbers in this comment are theirs today.
 *
 * The bundle comes from a server the device need not trust, so nothing about its table is
 * trusted, and nothing is cached between checks (a cached figure could be poisoned):
 *
 * 1. a **degenerate table** is refused ({@link tableProblem}): identical regular rows (all of
 *    them compared), or a regular row nearer to another than 1e-3 × the median nearest-row
 *    distance of 256 rows drawn afresh;
 * 2. a worst case η · 2 max‖φ‖ that is not finite is refused;
 * 3. the output is **measured directly** ({@link measureUnchanged}): regular tokens (under a
 *    token policy, those outside its public list: {@link floorTokens}) drawn with
 *    the generator (OS entropy unless the caller passes a seeded one), 128 at a time, privatized
 *    by the real dchi-text mechanism at η; the tokens that come back unchanged are counted
 *    until the Wilson score interval at z = 5 lies on one side of τ, or 2,048 were drawn; the
 *    share decides;
 * 4. a refusal says where the floor starts on this bundle: the analytic estimate of
 *    ./floor_estimate.ts on 256 (token, direction) pairs drawn next from the same generator.
 *
 * Drawn in numpy's order from the same generator, a seeded run gives the Python edge's tokens,
 * noise, decision and message.
 */

import type { EdgeBundle } from "../bundle/bundle.js";
import type { TokenPolicy } from "../bundle/policy.js";
import { DChiText } from "../mechanisms/dchi.js";
import { WeakPrivacyError } from "../errors.js";
import { DChiFloor } from "./floor_estimate.js";
import { COMPUTABLE, FLOOR } from "../generated/spec.js";
import { message, pct, weakHead } from "../format/messages.js";
import type { ExactNearest, NearestOptions } from "../search/nearest.js";
import { resolveSource, type BitSource } from "../random/random.js";
import { choiceWithoutReplacement } from "../random/samplers.js";
import { identicalRows, nearDuplicates } from "./table_checks.js";
import { isMetric, sendsEmbeddings, substitutesTokens } from "../mechanisms/specs.js";
import { measure, now } from "../timing.js";

export { DChiFloor, gammaCdf } from "./floor_estimate.js";
export { DUPLICATE_SAMPLE, NEAR_DUPLICATE } from "./table_checks.js";
export { pct } from "../format/messages.js";

// the floor's constants are shared.floor's, read from the mechanism spec (shared/spec)
/** the share of unchanged tokens above which dχ is refused (shared.floor.THRESHOLD) */
export const THRESHOLD: number = FLOOR.THRESHOLD;
/** tokens privatized by the direct measurement's first step */
export const MEASURE_FIRST: number = FLOOR.MEASURE_FIRST;
/** at most this many tokens per step of the direct measurement (each step doubles what was drawn) */
export const MEASURE_BATCH: number = FLOOR.MEASURE_BATCH;
/** at most this many, then the estimate decides (its standard error is at most 0.011) */
export const MEASURE_MAX: number = FLOOR.MEASURE_MAX;
/** the Wilson interval's z: each look decides wrongly with probability < 3e-7 (at most 18 looks) */
export const MEASURE_Z: number = FLOOR.MEASURE_Z;
/** (token, direction) pairs of the estimate a refusal quotes */
export const ESTIMATE_TOKENS: number = FLOOR.ESTIMATE_TOKENS;
const F32_MAX: number = COMPUTABLE.F32_MAX;

/** The Wilson score interval of a binomial share k/n at ``z`` (shared.floor.wilson_interval,
 * the same operations in the same order). */
export function wilsonInterval(k: number, n: number, z = MEASURE_Z): [number, number] {
  if (n <= 0) return [0, 1];
  const p = k / n;
  const z2 = z * z;
  const centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const half = z * Math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n);
  return [Math.max(0, centre - half), Math.min(1, centre + half)];
}

/** A macrotask's pause between the floor's steps: a page that privatizes while its floor is
 * measured (Privatizer.open) gets its clicks and paints in between; the steps, their draws and
 * the decision are the same. */
function yieldToPage(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 0));
}

// -- the table itself ----------------------------------------------------------------------------
/** Identical regular rows, per verified bundle (its content cannot change; nothing persists). */
const IDENTICAL = new WeakMap<EdgeBundle, string | null>();

/**
 * Null for a usable privatization table, else why it is degenerate (one clause, as
 * shared.floor.table_problem): identical regular rows (all compared; remembered per bundle
 * object), or near-duplicates among rows drawn from ``source`` at every call.
 */
export async function tableProblem(bundle: EdgeBundle, index: ExactNearest,
                                   source?: BitSource | null): Promise<string | null> {
  if (!IDENTICAL.has(bundle)) {
    const t0 = now();
    IDENTICAL.set(bundle, identicalRows(bundle));
    measure("floor-identical", t0);
  }
  const found = IDENTICAL.get(bundle)!;
  if (found !== null) return found;
  await yieldToPage();
  return nearDuplicates(bundle, index, resolveSource(source));
}

// -- the output, measured ----------------------------------------------------------------------
/** The tokens the floor draws from (shared.floor.floor_tokens): the bundle's regular tokens, less
 * the public words of the token policy applied (which carry no guarantee: the floor judges the
 * others). */
export function floorTokens(bundle: EdgeBundle, policy: TokenPolicy | null = null): Int32Array {
  const reg = bundle.regularIds;
  return policy === null ? reg : reg.filter((v) => policy.publicIds[v] !== 1);
}

/**
 * [unchanged, drawn]: regular tokens drawn uniformly from ``source`` (OS entropy by default)
 * and privatized by ``text`` at its η in steps of {@link MEASURE_FIRST}, then as many as were
 * drawn, at most {@link MEASURE_BATCH} (distinct within a step, numpy's choice), until the
 * Wilson interval lies on one side of ``threshold`` or {@link MEASURE_MAX} were drawn
 * (shared.floor.measure_unchanged). ``policy``: the token policy applied (its public words are
 * not drawn; the others are privatized as without it: no coin is drawn for them).
 */
export async function measureUnchanged(text: DChiText, source?: BitSource | null,
                                       threshold = THRESHOLD, policy: TokenPolicy | null = null): Promise<[number, number]> {
  const src = resolveSource(source);
  const reg = floorTokens(text.bundle, policy);
  let same = 0;
  let drawn = 0;
  while (drawn < MEASURE_MAX) {
    await yieldToPage();
    const size = Math.min(Math.max(drawn, MEASURE_FIRST), MEASURE_BATCH, MEASURE_MAX - drawn, reg.length);
    const pick = choiceWithoutReplacement(src, reg.length, size);
    const x = pick.map((i) => reg[i]!);
    const y = await text.privatizeIds(x, src);
    for (let i = 0; i < x.length; i++) if (y[i] === x[i]) same++;
    drawn += x.length;
    const [lo, hi] = wilsonInterval(same, drawn);
    if (hi <= threshold || lo > threshold) break;
  }
  return [same, drawn];
}

// -- the floor -----------------------------------------------------------------------------------
export interface FloorOptions {
  /** what the checks draw from: OS entropy by default; a seeded generator only for
   * reproducible tests (it makes the check predictable) */
  source?: BitSource | null;
  threshold?: number;
  /** the token policy the mechanism applies: the floor judges the tokens outside its list */
  policy?: TokenPolicy | null;
}

/**
 * Null if dχ at ``eta`` passes the floor of ``bundle``, else the one-line reason, worded as
 * shared.floor's. ``text``: the dchi-text mechanism on the bundle at the same η (its exact
 * search serves every step); dchi-embedding is judged by the same measurement (whether the
 * noisy row's nearest regular token is the token) and needs the model's embeddings.
 */
export async function dchiWeakReason(name: string, eta: number, bundle: EdgeBundle, text: DChiText,
                                     options: FloorOptions = {}): Promise<string | null> {
  const threshold = options.threshold ?? THRESHOLD;
  if (!(threshold > 0 && threshold < 1)) throw new RangeError(`threshold must be in (0, 1), got ${threshold}`);
  if (!isMetric(name)) throw new RangeError(`${name} is not a dχ mechanism`);
  if (text.bundle !== bundle || text.eta !== eta) throw new RangeError("the floor's text-to-text sampler must be the bundle's, at the same eta");
  if (sendsEmbeddings(name)) void bundle.embeddings; // BundleError: a designed table serves token ids only
  const src = resolveSource(options.source);
  const head = weakHead(message("DCHI_WHAT", { mechanism: name, eta }));
  await yieldToPage();
  let t0 = now();
  const problem = await tableProblem(bundle, text.index, src);
  measure("floor-table", t0);
  if (problem !== null) return message("DCHI_DEGENERATE", { head, problem });
  // shared.floor sums the squares in float32: a sum past float32's range is not finite there
  const top2 = bundle.regularMaxNorm ** 2;
  const tMax = top2 > F32_MAX ? Infinity : Math.sqrt(top2);
  if (!Number.isFinite(eta * 2 * tMax)) {
    return message("DCHI_NOT_FINITE", { head });
  }
  t0 = now();
  const [same, drawn] = await measureUnchanged(text, src, threshold, options.policy ?? null);
  measure("floor-measure", t0);
  if (same / drawn <= threshold) return null;
  // a payload of token ids says what came back; one of rows, whether the row's nearest token is the token
  const outcome = substitutesTokens(name) ? message("DCHI_TEXT_OUTCOME") : message("DCHI_EMBEDDING_OUTCOME");
  const reg = bundle.regularIds;
  const estimate = await DChiFloor.compute(bundle.regularTable, reg.length, bundle.tableDim, text.index,
    ESTIMATE_TOKENS, src);
  const start = estimate.floorEta(threshold);
  return message("DCHI_MEASURED", { head, share: pct(same / drawn), drawn, outcome, floor: pct(threshold), start });
}

/**
 * Check dχ at ``eta`` against the floor of ``bundle``, as shared.floor.require_privacy_floor:
 * null when it passes, else the reason, thrown as {@link WeakPrivacyError} unless
 * ``allowWeak``. ``text``: the dchi-text mechanism at ``eta`` on the bundle, or null to build
 * one for the check (dchi-embedding) and release it after.
 */
export async function checkDchiFloor(name: string, eta: number, bundle: EdgeBundle, text: DChiText | null,
                                     options: FloorOptions & { allowWeak?: boolean; search?: NearestOptions } = {}
): Promise<string | null> {
  if (sendsEmbeddings(name)) void bundle.embeddings;
  const own = text === null ? await DChiText.create(bundle, eta, options.search ?? {}) : null;
  try {
    const why = await dchiWeakReason(name, eta, bundle, text ?? own!, options);
    if (why !== null && !options.allowWeak) throw new WeakPrivacyError(why);
    return why;
  } finally {
    await own?.release();
  }
}
