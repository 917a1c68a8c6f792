/**
 * Browser storage behind the library's small interfaces: the device ledger in IndexedDB
 * ({@link IndexedDbLedgerStore}: one readwrite transaction per charge, the memo key a
 * non-extractable CryptoKey), verified bundles in the Cache API ({@link CacheApiBundleCache}),
 * the bundle pins in IndexedDB ({@link IndexedDbPinStore}: ../service/pins.ts), and an unverified
 * bundle's passed text floor, signed under a non-extractable key of this device
 * ({@link IndexedDbTextFloorCache}: ../floor/text_floor_cache.ts). Nothing else of the privacy
 * floor is stored: it is measured at every check.
 * Web APIs only; exercised by the page's browser test.
 */

import { EdgeBundle } from "../bundle/bundle.js";
import type { BundleCache } from "../service/client.js";
import type { PinStore } from "../service/pins.js";
import { newSigningKey, type TextFloorCache } from "../floor/text_floor_cache.js";
import { emptyState, newHmacKey, type LedgerState, type LedgerStore } from "../ledger/ledger.js";

const STORE = "kv";

function request<T>(r: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error ?? new Error("IndexedDB request failed"));
  });
}

function openDb(name: string): Promise<IDBDatabase> {
  const r = indexedDB.open(name, 1);
  r.onupgradeneeded = () => r.result.createObjectStore(STORE);
  return request(r);
}

/** The device ledger in IndexedDB (database ``name``, default "privbert-ledger"). */
export class IndexedDbLedgerStore implements LedgerStore {
  readonly where: string;
  private db: Promise<IDBDatabase> | null = null;

  constructor(private readonly name = "privbert-ledger") {
    this.where = `IndexedDB ${name}`;
  }

  private open(): Promise<IDBDatabase> {
    this.db ??= openDb(this.name);
    return this.db;
  }

  async read(): Promise<LedgerState> {
    const db = await this.open();
    const got = await request(db.transaction(STORE).objectStore(STORE).get("state")) as LedgerState | undefined;
    return got ?? emptyState();
  }

  async update<T>(fn: (s: LedgerState) => { state: LedgerState | null; result: T }): Promise<T> {
    const db = await this.open();
    const tx = db.transaction(STORE, "readwrite", { durability: "strict" });
    const store = tx.objectStore(STORE);
    const done = new Promise<void>((resolve, reject) => {
      tx.oncomplete = () => resolve();
      tx.onabort = tx.onerror = () => reject(tx.error ?? new Error("IndexedDB transaction failed"));
    });
    let out: T;
    try {
      const cur = (await request(store.get("state")) as LedgerState | undefined) ?? emptyState();
      const { state, result } = fn(cur);
      out = result;
      if (state !== null) store.put(state, "state");
    } catch (exc) {
      tx.abort();
      await done.catch(() => undefined);
      throw exc;
    }
    await done; // committed (or rejected: then nothing may be sent)
    return out;
  }

  async hmacKey(): Promise<CryptoKey> {
    const db = await this.open();
    const got = await request(db.transaction(STORE).objectStore(STORE).get("hmac-key")) as CryptoKey | undefined;
    if (got) return got;
    const key = await newHmacKey();
    const tx = db.transaction(STORE, "readwrite");
    // add(): fails if another tab made one first; then that one is used
    await request(tx.objectStore(STORE).add(key, "hmac-key")).catch(() => undefined);
    const again = await request(db.transaction(STORE).objectStore(STORE).get("hmac-key")) as CryptoKey | undefined;
    return again ?? key;
  }
}

/** Verified bundles' tarballs in the Cache API (cache ``name``); every load is verified again. */
export class CacheApiBundleCache implements BundleCache {
  constructor(private readonly name = "privbert-bundles") {}

  private key(id: string): string {
    return `https://privbert.invalid/bundles/${id}`;
  }

  async get(bundleId: string): Promise<EdgeBundle | null> {
    const c = await caches.open(this.name);
    const hit = await c.match(this.key(bundleId));
    if (!hit) return null;
    try {
      return await EdgeBundle.fromTar(new Uint8Array(await hit.arrayBuffer()), bundleId);
    } catch {
      await c.delete(this.key(bundleId)); // corrupted copy: fetched again
      return null;
    }
  }

  async put(bundleId: string, tarball: Uint8Array): Promise<void> {
    const c = await caches.open(this.name);
    await c.put(this.key(bundleId), new Response(tarball as Uint8Array<ArrayBuffer>));
  }
}

/** The bundle pins (server and model → the bundle first accepted) in IndexedDB (database
 * ``name``, default "privbert-pins"). A database the page may not open is an error, never a
 * fresh start. */
export class IndexedDbPinStore implements PinStore {
  readonly where: string;
  private db: Promise<IDBDatabase> | null = null;

  constructor(private readonly name = "privbert-pins") {
    this.where = `IndexedDB ${name}`;
  }

  private open(): Promise<IDBDatabase> {
    this.db ??= openDb(this.name);
    return this.db;
  }

  async get(key: string): Promise<string | null> {
    const db = await this.open();
    const got = await request(db.transaction(STORE).objectStore(STORE).get(key)) as unknown;
    return typeof got === "string" ? got : null;
  }

  async put(key: string, bundleId: string): Promise<void> {
    const db = await this.open();
    const tx = db.transaction(STORE, "readwrite", { durability: "strict" });
    const done = new Promise<void>((resolve, reject) => {
      tx.oncomplete = () => resolve();
      tx.onabort = tx.onerror = () => reject(tx.error ?? new Error("IndexedDB transaction failed"));
    });
    tx.objectStore(STORE).put(bundleId, key);
    await done;
  }

  async all(): Promise<Record<string, string>> {
    const db = await this.open();
    const store = db.transaction(STORE).objectStore(STORE);
    const [keys, values] = await Promise.all([request(store.getAllKeys()), request(store.getAll())]);
    const out: Record<string, string> = {};
    keys.forEach((k, i) => {
      if (typeof k === "string" && typeof values[i] === "string") out[k] = values[i];
    });
    return out;
  }
}

/** Passed text floors in IndexedDB (database ``name``), signed with a non-extractable HMAC key
 * kept beside them: a script of the page can use the key, never read it out. */
export class IndexedDbTextFloorCache implements TextFloorCache {
  readonly where: string;
  private db: Promise<IDBDatabase> | null = null;

  constructor(private readonly name = "privbert-text-floor") {
    this.where = `IndexedDB ${name}`;
  }

  private open(): Promise<IDBDatabase> {
    this.db ??= openDb(this.name);
    return this.db;
  }

  async get(key: string): Promise<string | null> {
    const db = await this.open();
    const got = await request(db.transaction(STORE).objectStore(STORE).get(`entry:${key}`)) as unknown;
    return typeof got === "string" ? got : null;
  }

  async put(key: string, entry: string): Promise<void> {
    const db = await this.open();
    await request(db.transaction(STORE, "readwrite").objectStore(STORE).put(entry, `entry:${key}`));
  }

  async signingKey(): Promise<CryptoKey> {
    const db = await this.open();
    const got = await request(db.transaction(STORE).objectStore(STORE).get("key")) as CryptoKey | undefined;
    if (got) return got;
    const key = await newSigningKey();
    await request(db.transaction(STORE, "readwrite").objectStore(STORE).add(key, "key")).catch(() => undefined);
    const again = await request(db.transaction(STORE).objectStore(STORE).get("key")) as CryptoKey | undefined;
    return again ?? key;
  }
}
