/**
 * Node's bundle cache: verified bundles in a directory per bundle id, in the Python edge's
 * layout (``$PRIVBERT_CACHE/<bundle_id>/`` if set, else ``$XDG_CACHE_HOME/privbert/bundles/<id>``),
 * so both edges share one cache (and its ``pins.json``: ./pins.ts). Every load verifies each file
 * against ``bundle.json`` and the id. Nothing of the privacy floor is cached: it is measured at
 * every check (a cached figure could be poisoned; issue 34); an unverified bundle's passed text
 * floor is kept, signed by this device ({@link FileTextFloorCache}).
 */

import { mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync, writeFileSync, existsSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { homedir } from "node:os";
import { join } from "node:path";

import { EdgeBundle, META_FILE } from "../bundle/bundle.js";
import type { BundleCache } from "../service/client.js";
import { BundleError } from "../errors.js";
import { DEVICE } from "../generated/spec.js";
import { parseTar } from "nanotar";
import type { TextFloorCache } from "../floor/text_floor_cache.js";

export const CACHE_ENV: string = DEVICE.cache.env;
const BUNDLE_ID = /^[0-9a-f]{64}$/;

export function cacheRoot(): string {
  const env = process.env[CACHE_ENV];
  if (env) return env.replace(/^~(?=\/|$)/, homedir());
  const xdg = process.env.XDG_CACHE_HOME || join(homedir(), ".cache");
  return join(xdg, ...DEVICE.cache.subdir);
}

/** A bundle directory, verified (every file against bundle.json, and the id). */
export async function loadBundleDir(dir: string, expectedId?: string | null): Promise<EdgeBundle> {
  return EdgeBundle.fromFiles((name) => {
    try {
      return new Uint8Array(readFileSync(join(dir, name)));
    } catch (exc) {
      const code = (exc as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "EISDIR") return undefined;
      throw new BundleError(`${dir}/${name}: cannot be read (${code ?? (exc as Error).message})`);
    }
  }, dir, expectedId);
}

export class DirBundleCache implements BundleCache {
  constructor(readonly root: string = cacheRoot()) {}

  path(bundleId: string): string {
    if (!BUNDLE_ID.test(bundleId)) throw new BundleError(`not a bundle id (64 hex digits): ${JSON.stringify(bundleId)}`);
    return join(this.root, bundleId);
  }

  async get(bundleId: string): Promise<EdgeBundle | null> {
    const dir = this.path(bundleId);
    if (!existsSync(join(dir, META_FILE))) return null;
    try {
      return await loadBundleDir(dir, bundleId);
    } catch {
      return null; // corrupted or partial: fetched again
    }
  }

  /** Write the (already verified) tarball's files into a temporary sibling, then rename it. */
  async put(bundleId: string, tarball: Uint8Array): Promise<void> {
    const dir = this.path(bundleId);
    mkdirSync(this.root, { recursive: true });
    const tmp = mkdtempSync(join(this.root, `.${bundleId}.`));
    try {
      const buf = (tarball.buffer as ArrayBuffer).slice(tarball.byteOffset, tarball.byteOffset + tarball.byteLength);
      for (const f of parseTar(buf)) {
        if (f.data && /^[A-Za-z0-9_.-]+$/.test(f.name)) writeFileSync(join(tmp, f.name), f.data);
      }
      rmSync(dir, { recursive: true, force: true });
      renameSync(tmp, dir);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  }
}

/**
 * Passed text floors of unverified bundles (../floor/text_floor_cache.ts) in
 * ``<cache root>/.text-floor/``, one file per bundle id and η, signed with this device's key
 * (``.text-floor/key``: 32 random bytes, created 0600). A key file others can write, or one
 * owned by another user, is refused: whoever could write it could sign a pass of their own.
 */
export class FileTextFloorCache implements TextFloorCache {
  readonly where: string;
  private key: Promise<CryptoKey> | null = null;

  constructor(root: string = cacheRoot()) {
    this.where = join(root, ".text-floor");
  }

  private file(key: string): string {
    return join(this.where, `${key.replace(/[^A-Za-z0-9@.+-]/g, "_")}.json`);
  }

  async get(key: string): Promise<string | null> {
    try {
      return readFileSync(this.file(key), "utf-8");
    } catch {
      return null;
    }
  }

  async put(key: string, entry: string): Promise<void> {
    mkdirSync(this.where, { recursive: true, mode: 0o700 });
    const tmp = `${this.file(key)}.${randomBytes(6).toString("hex")}`;
    writeFileSync(tmp, entry, { mode: 0o600, flag: "wx" });
    renameSync(tmp, this.file(key));
  }

  signingKey(): Promise<CryptoKey> {
    this.key ??= this.loadKey();
    return this.key;
  }

  private async loadKey(): Promise<CryptoKey> {
    const path = join(this.where, "key");
    mkdirSync(this.where, { recursive: true, mode: 0o700 });
    try {
      writeFileSync(path, randomBytes(32), { mode: 0o600, flag: "wx" });
    } catch (exc) {
      if ((exc as NodeJS.ErrnoException).code !== "EEXIST") throw exc;
    }
    const st = statSync(path);
    const uid = process.getuid?.();
    if ((st.mode & 0o022) || (uid !== undefined && st.uid !== uid) || st.size !== 32) {
      throw new Error(`${path}: the text floor's key is not this user's own 32-byte file (mode ${(st.mode & 0o777).toString(8)}); `
        + `remove the folder ${this.where} (its entries are measured again)`);
    }
    const raw = new Uint8Array(readFileSync(path));
    return crypto.subtle.importKey("raw", raw, { name: "HMAC", hash: "SHA-256" }, false, ["sign", "verify"]);
  }
}
