/**
 * The bundles this edge vouches for (shared/trust.py, issue 42): each release carries the ids
 * of the bundles privbert builds from public sources (the packaged MiniLM-L6-H384 with each of
 * its tables), read from the spec. A bundle is known (trusted as it is), trusted (an id the app
 * or user listed: `trustedBundles`, `--trusted-bundles`), or unverified: then the text floor
 * (../floor/text_floor.ts) measures it too, the printed guarantee says so, and
 * `refuseUnverified` (`--refuse-unverified`) refuses it outright.
 */

import { KNOWN_BUNDLES } from "../generated/spec.js";
import { message } from "../format/messages.js";

export type TrustKind = "known" | "trusted" | "unverified";

/** How far the edge vouches for one bundle; ``name``: the known table's name. */
export interface Trust {
  bundleId: string;
  kind: TrustKind;
  name: string | null;
}

const BY_ID = new Map<string, string>(Object.entries(KNOWN_BUNDLES.bundles).map(([name, id]) => [id, name]));

/** Table name → bundle id of the bundles privbert builds from public sources. */
export const KNOWN: Readonly<Record<string, string>> = KNOWN_BUNDLES.bundles;

/** Known, trusted (one of ``trusted``) or unverified (shared.trust.trust). */
export function trust(bundleId: string, trusted: ReadonlySet<string> = new Set()): Trust {
  const name = BY_ID.get(bundleId);
  if (name !== undefined) return { bundleId, kind: "known", name };
  return { bundleId, kind: trusted.has(bundleId) ? "trusted" : "unverified", name: null };
}

/** Known or trusted: used as it is (no text floor). */
export function vouched(t: Trust): boolean {
  return t.kind !== "unverified";
}

/** One line for the printed guarantee (shared.trust.Trust.note); ``how``: how this edge trusts a bundle. */
export function trustNote(t: Trust, how = "--trusted-bundles"): string {
  const b12 = t.bundleId.slice(0, 12);
  if (t.kind === "known") return message("BUNDLE_KNOWN", { bundle_id12: b12, name: `MiniLM-L6-H384 table ${t.name}` });
  if (t.kind === "trusted") return message("BUNDLE_TRUSTED", { bundle_id12: b12, how });
  return message("BUNDLE_UNVERIFIED", { bundle_id12: b12 });
}
