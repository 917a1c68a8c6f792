/**
 * Node's bundle cache: verified bundles in a directory per bundle id, in the Python edge's
 * layout (``$PRIVBERT_CACHE/<bundle_id>/`` if set, else ``$XDG_CACHE_HOME/privbert/bundles/<id>``),
 * so both edges share one cache (and its ``pins.json``: ./pins.ts). Every load verifies each file
 * against ``bundle.json`` and the id. Nothing of the privacy floor is cached: it is measured at
 * every check (a cached figure could be poisoned; issue 34).
 */

import { mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

import { EdgeBundle, META_FILE } from "../bundle/bundle.js";
import type { BundleCache } from "../service/client.js";
import { BundleError } from "../errors.js";
import { DEVICE } from "../generated/spec.js";
import { parseTar } from "nanotar";

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
