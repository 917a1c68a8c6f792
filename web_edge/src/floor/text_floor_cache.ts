/**
 * Passed text-floor measurements kept between page loads (issue 42: the text floor of an
 * unverified bundle costs seconds; a page must not pay them at every load). One entry per
 * bundle id and η, signed with HMAC-SHA-256 under a key of this device: in a page a
 * non-extractable CryptoKey kept in IndexedDB (script can use it, not read it out), in Node a
 * key file beside the bundle cache, private to the user. An entry is used only when its
 * signature verifies under this device's key, it names this bundle, this η and this spec's
 * text floor (its sample's digest and constants), and what it records passes the floor; any
 * other entry (poisoned, from another device, from another release) is measured afresh, so a
 * poisoned cache is refused as the bundle itself would be. Only passes are kept: a refusal is
 * measured at every check.
 */

import { TEXT_FLOOR } from "../generated/spec.js";
import type { TextMeasure } from "./text_floor.js";

/** Where signed entries live; ``signingKey`` is this device's HMAC key (SHA-256). */
export interface TextFloorCache {
  readonly where: string;
  get(key: string): Promise<string | null>;
  put(key: string, entry: string): Promise<void>;
  signingKey(): Promise<CryptoKey>;
}

/** Entries in memory (tests; a process that must not remember), under a fresh key. */
export class MemoryTextFloorCache implements TextFloorCache {
  readonly where = "memory";
  readonly entries = new Map<string, string>();
  private key: Promise<CryptoKey> | null = null;

  async get(key: string): Promise<string | null> {
    return this.entries.get(key) ?? null;
  }

  async put(key: string, entry: string): Promise<void> {
    this.entries.set(key, entry);
  }

  signingKey(): Promise<CryptoKey> {
    this.key ??= newSigningKey();
    return this.key;
  }
}

/** A new non-extractable HMAC-SHA-256 key. */
export function newSigningKey(): Promise<CryptoKey> {
  return crypto.subtle.generateKey({ name: "HMAC", hash: "SHA-256" }, false, ["sign", "verify"]);
}

/** The entry's name: bundle id and η (as JSON writes it). */
export function entryKey(bundleId: string, eta: number): string {
  return `${bundleId}@${JSON.stringify(eta)}`;
}

/** What an entry is bound to besides its bundle and η: the spec's text floor, whole. */
const BOUND = JSON.stringify(TEXT_FLOOR);

function body(bundleId: string, eta: number, m: TextMeasure): string {
  return JSON.stringify({ v: 1, bundle_id: bundleId, eta, text_floor: BOUND,
    measure: [m.pieces, m.words, m.tokens, m.draws, m.unchanged, m.decoded] });
}

function hex(b: ArrayBuffer): string {
  return Array.from(new Uint8Array(b), (x) => x.toString(16).padStart(2, "0")).join("");
}

function unhex(s: string): Uint8Array<ArrayBuffer> | null {
  if (!/^[0-9a-f]{64}$/.test(s)) return null;
  const out = new Uint8Array(new ArrayBuffer(32));
  s.match(/../g)!.forEach((x, i) => {
    out[i] = parseInt(x, 16);
  });
  return out;
}

/** Keep a measurement that passed, signed. */
export async function rememberPass(cache: TextFloorCache, bundleId: string, eta: number, m: TextMeasure): Promise<void> {
  const b = body(bundleId, eta, m);
  const mac = await crypto.subtle.sign("HMAC", await cache.signingKey(), new TextEncoder().encode(b));
  await cache.put(entryKey(bundleId, eta), JSON.stringify({ body: b, mac: hex(mac) }));
}

/** The kept measurement of this bundle at this η, or null when there is none that verifies
 * (the caller then measures; ``passes`` decides what the entry records). */
export async function keptPass(cache: TextFloorCache, bundleId: string, eta: number,
                               passes: (m: TextMeasure) => boolean): Promise<TextMeasure | null> {
  let entry: unknown;
  try {
    const raw = await cache.get(entryKey(bundleId, eta));
    if (raw === null) return null;
    entry = JSON.parse(raw);
  } catch {
    return null;
  }
  const e = entry as { body?: unknown; mac?: unknown };
  if (typeof e?.body !== "string" || typeof e.mac !== "string") return null;
  const mac = unhex(e.mac);
  if (mac === null) return null;
  const ok = await crypto.subtle.verify("HMAC", await cache.signingKey(), mac, new TextEncoder().encode(e.body));
  if (!ok) return null;
  const d = JSON.parse(e.body) as { v?: unknown; bundle_id?: unknown; eta?: unknown; text_floor?: unknown; measure?: unknown };
  const f = d.measure;
  if (d.v !== 1 || d.bundle_id !== bundleId || d.eta !== eta || d.text_floor !== BOUND
      || !Array.isArray(f) || f.length !== 6 || !f.every((x) => Number.isInteger(x) && x >= 0)) return null;
  const [pieces, words, tokens, draws, unchanged, decoded] = f as number[];
  const m: TextMeasure = { pieces: pieces!, words: words!, tokens: tokens!, draws: draws!, unchanged: unchanged!, decoded: decoded! };
  return passes(m) ? m : null;
}
