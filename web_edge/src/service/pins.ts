/**
 * Bundle pinning (edge_agent/service/pins.py): a device remembers the bundle it first accepted
 * for a served model.
 *
 * The bundle decides what privatization means (its table is the space the noise is added in),
 * and it comes from a server the device need not trust. So the first bundle a device accepts
 * for (server, model) is pinned, and a server that later names another one is refused in one
 * line naming both ids, before any of the new bundle is fetched, until the user accepts the new
 * id explicitly (`--accept-bundle ID`, the `acceptBundle` option). A pin is keyed by the server
 * (scheme, host, port, path) and the model; a server that stops serving a pinned model and serves
 * one under a new name with a new bundle (a rename, to be pinned afresh) is refused the same way
 * (issue 42). An app can also ship the ids it trusts (`--trusted-bundles`,
 * `$PRIVBERT_TRUSTED_BUNDLES`, the `trustedBundles` option), which replace a pin without asking;
 * `refuseUnverified` (`--refuse-unverified`) refuses every bundle neither known nor trusted.
 *
 * Where pins live is a {@link PinStore}: `pins.json` beside the bundle cache in Node (the Python
 * edge's file: ../node/pins.ts), IndexedDB in a page (../session/browser_stores.ts), memory in tests.
 */

import { PrivbertClient, type BundleCache, type ModelInfo, type ProgressCallback } from "./client.js";
import type { EdgeBundle } from "../bundle/bundle.js";
import { BundleError } from "../errors.js";
import { message } from "../format/messages.js";
import { DEVICE } from "../generated/spec.js";
import { trust, vouched, type Trust } from "../bundle/trust.js";

export const TRUSTED_ENV: string = DEVICE.cache.trusted_env;
const BUNDLE_ID = /^[0-9a-f]{64}$/;

/** The server names a bundle other than the one this device pinned (or trusts). */
export class BundleChanged extends BundleError {
  override name = "BundleChanged";
}

/** Where the pins are kept: server key → bundle id. A store that cannot be read throws (a
 * damaged store is never a fresh start: that would accept whatever the server says). */
export interface PinStore {
  readonly where: string;
  get(key: string): Promise<string | null>;
  put(key: string, bundleId: string): Promise<void>;
  /** every pin (what a rename is checked against; a store without it cannot tell one) */
  all?(): Promise<Record<string, string>>;
}

/** Pins in memory (tests; a process that must not remember). */
export class MemoryPinStore implements PinStore {
  readonly where = "memory";
  readonly pins = new Map<string, string>();

  async get(key: string): Promise<string | null> {
    return this.pins.get(key) ?? null;
  }

  async put(key: string, bundleId: string): Promise<void> {
    this.pins.set(key, bundleId);
  }

  async all(): Promise<Record<string, string>> {
    return Object.fromEntries(this.pins);
  }
}

/** Bundle ids from a comma-separated string or a list; RangeError naming ``what`` for a
 * malformed one (pins.parse_ids). */
export function parseIds(text: string | readonly string[] | null | undefined, what: string): Set<string> {
  if (text === null || text === undefined) return new Set();
  const items = typeof text === "string" ? text.split(",") : [...text];
  const ids = new Set(items.map((s) => s.trim().toLowerCase()).filter((s) => s !== ""));
  for (const s of ids) {
    if (!BUNDLE_ID.test(s)) throw new RangeError(`${what}: '${s}' is not a bundle id (64 hex digits)`);
  }
  return ids;
}

/** ``scheme://host:port/path|model``: one pin per service and model, as pins.server_key writes
 * it (urllib's urlsplit: host lowercased, the port only when the URL gives one, no trailing /). */
export function serverKey(server: string, modelId: string): string {
  const m = /^([^:/?#]+):(?:\/\/([^/?#]*))?([^?#]*)/.exec(server.trim());
  const scheme = (m?.[1] ?? "").toLowerCase();
  let netloc = m?.[2] ?? "";
  const path = (m?.[3] ?? "").replace(/\/+$/, "");
  netloc = netloc.slice(netloc.lastIndexOf("@") + 1);
  let host = netloc;
  let port = "";
  const v6 = /^\[([^\]]*)\](?::(\d*))?$/.exec(netloc);
  if (v6) {
    host = v6[1]!;
    port = v6[2] ?? "";
  } else if (netloc.includes(":")) {
    host = netloc.slice(0, netloc.lastIndexOf(":"));
    port = netloc.slice(netloc.lastIndexOf(":") + 1);
  }
  const p = /^\d+$/.test(port) && Number(port) !== 0 ? `:${Number(port)}` : ""; // Python: "if u.port"
  return `${scheme}://${host.toLowerCase()}${p}${path}|${modelId}`;
}

/** The bundle's trust (../bundle/trust.ts); BundleChanged (one line) for an unverified bundle
 * when ``refuse`` (known before a byte of the bundle is fetched). ``flag``/``trustHow``: how this
 * edge names the refusal and the way to trust a bundle (by default the words of ``audience``). */
export function checkVouched(bundleId: string, trusted: ReadonlySet<string>, refuse: boolean,
                             flag?: string, trustHow?: string, audience: PinAudience = "page"): Trust {
  const t = trust(bundleId, trusted);
  if (refuse && !vouched(t)) {
    const page = audience === "page";
    throw new BundleChanged(message("UNVERIFIED_REFUSED", { bundle_id12: bundleId.slice(0, 12),
      flag: flag ?? (page ? "the refuseUnverified option" : "--refuse-unverified"),
      trust: trustHow ?? (page ? "the trustedBundles option" : "--trusted-bundles"), bundle_id: bundleId }));
  }
  return t;
}

/** Who reads a refusal: a page's developer (the `acceptBundle` and `trustedBundles` options of
 * `EdgeSession.open`) or a command line's user (`--accept-bundle`, `--trusted-bundles`). */
export type PinAudience = "page" | "cli";

/** A refusal (the spec's template, worded for the command line as both edges print it) in
 * the words of ``audience``: a page names its options, not the flags. */
function worded(text: string, audience: PinAudience): string {
  if (audience === "cli") return text;
  return text.replace(/accept it with --accept-bundle ([0-9a-f]{64})/, 'accept it with the acceptBundle option: acceptBundle: ["$1"]');
}

export interface PinOptions {
  /** ids the user accepts in place of a pin */
  accept?: ReadonlySet<string>;
  /** ids the app trusts as they are (they replace a pin without asking) */
  trusted?: ReadonlySet<string>;
  /** refuse a bundle neither known nor trusted, and how to say it */
  refuseUnverified?: boolean;
  refuseHow?: string;
  trustHow?: string;
  /** the model ids the server serves now: a new model while a pinned one is gone is a rename */
  served?: readonly string[] | null;
  /** false: check only (before the bundle is fetched); the pin is recorded once it is verified */
  record?: boolean;
  /** whose words a refusal is in: "page" (default: the options of `EdgeSession.open`) or "cli" */
  audience?: PinAudience;
}

/**
 * Pin ``bundleId`` for (server, model) on first use, or check it against the pin: "pinned"
 * (first use), "same", or "accepted" (a change the user accepted); BundleChanged (one line,
 * both ids, the Python edge's words) otherwise.
 */
export async function checkPin(store: PinStore, server: string, modelId: string, bundleId: string,
                               options: PinOptions = {}): Promise<"pinned" | "same" | "accepted"> {
  const accept = options.accept ?? new Set<string>();
  const trusted = options.trusted ?? new Set<string>();
  const audience = options.audience ?? "page";
  checkVouched(bundleId, trusted, options.refuseUnverified ?? false, options.refuseHow, options.trustHow, audience);
  const key = serverKey(server, modelId);
  const old = await store.get(key);
  if (old === bundleId) return "same";
  const agreed = accept.has(bundleId) || trusted.has(bundleId);
  if (old !== null && !agreed) {
    throw new BundleChanged(worded(message("PIN_CHANGED", { model_id: modelId, server, bundle_id12: bundleId.slice(0, 12),
      pinned12: old.slice(0, 12), bundle_id: bundleId }), audience));
  }
  if (old === null && !agreed && options.served) {
    const here = await serverPins(store, key);
    const served = new Set(options.served);
    const gone = [...here.keys()].filter((m) => !served.has(m)).sort();
    if (gone.length && ![...here.values()].includes(bundleId)) {
      throw new BundleChanged(worded(message("PIN_RENAMED", { server, model_id: modelId, bundle_id12: bundleId.slice(0, 12),
        gone: gone[0]!, pinned12: here.get(gone[0]!)!.slice(0, 12), bundle_id: bundleId }), audience));
    }
  }
  if (options.record ?? true) await store.put(key, bundleId);
  return old === null ? "pinned" : "accepted";
}

/** Model → pinned bundle of every pin at ``key``'s server (a store that cannot list: none). */
async function serverPins(store: PinStore, key: string): Promise<Map<string, string>> {
  const server = key.slice(0, key.lastIndexOf("|"));
  const out = new Map<string, string>();
  for (const [k, v] of Object.entries(await store.all?.() ?? {})) {
    if (k.slice(0, k.lastIndexOf("|")) === server) out.set(k.slice(k.lastIndexOf("|") + 1), v);
  }
  return out;
}

/**
 * The served ``model``'s bundle, pinned: the pin checked before a byte of the bundle is
 * fetched, the bundle fetched (or read from ``cache``) and verified, ``beforePin(bundle)`` (the
 * floors) passed, then the pin recorded.
 * ``server`` is the URL as the user gave it (the pin's key).
 */
export async function pinnedBundle(client: PrivbertClient, server: string, model: ModelInfo,
                                   cache: BundleCache | null, pins: PinStore, options: PinOptions = {},
                                   onProgress: ProgressCallback | null = null,
                                   beforePin: ((bundle: EdgeBundle) => Promise<void>) | null = null,
): Promise<{ bundle: EdgeBundle; fetched: boolean; pin: "pinned" | "same" | "accepted" }> {
  if (typeof model.bundle_id !== "string") throw new BundleError(`model '${model.id}' names no bundle_id`);
  const modelId = String(model.id);
  const o = { served: client.servedIds, ...options };
  await checkPin(pins, server, modelId, model.bundle_id, { ...o, record: false });
  const got = await client.bundle(model.bundle_id, cache, onProgress);
  await beforePin?.(got.bundle); // the privacy floors: a bundle the device refuses is never pinned
  const pin = await checkPin(pins, server, modelId, model.bundle_id, { ...o, record: true });
  return { ...got, pin };
}
