/**
 * Node's caches: verified bundles in a directory per bundle id, in the Python edge's layout
 * (``$PRIVBERT_CACHE/<bundle_id>/`` if set, else ``$XDG_CACHE_HOME/privbert/bundles/<id>``),
 * so both edges share one cache; and the privacy floor's exit distances beside them
 * (``.floors/<bundle_id>.f64``). Every load verifies each file against ``bundle.json`` and the id.
 */

import { mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

import { EdgeBundle, META_FILE } from "../bundle.js";
import type { BundleCache } from "../client.js";
import { BundleError } from "../errors.js";
import type { FloorCache } from "../floor.js";
import { parseTar } from "nanotar";

export const CACHE_ENV = "PRIVBERT_CACHE";
const BUNDLE_ID = /^[0-9a-f]{64}$/;

export function cacheRoot(): string {
  const env = process.env[CACHE_ENV];
  if (env) return env.replace(/^~(?=\/|$)/, homedir());
  const xdg = process.env.XDG_CACHE_HOME || join(homedir(), ".cache");
  return join(xdg, "privbert", "bundles");
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

export class DirFloorCache implements FloorCache {
  constructor(readonly root: string = cacheRoot()) {}

  private file(key: string): string {
    if (!/^[0-9a-f]{64}(\.bound\d+)?$/.test(key)) throw new BundleError(`not a floor key: ${JSON.stringify(key)}`);
    return join(this.root, ".floors", `${key}.f64`);
  }

  async get(bundleId: string): Promise<Float64Array | null> {
    try {
      const b = readFileSync(this.file(bundleId));
      if (b.length % 8) return null;
      const out = new Float64Array(b.length / 8);
      for (let i = 0; i < out.length; i++) out[i] = b.readDoubleLE(8 * i);
      return out;
    } catch {
      return null;
    }
  }

  async put(bundleId: string, exit: Float64Array): Promise<void> {
    try {
      mkdirSync(join(this.root, ".floors"), { recursive: true });
      const b = Buffer.alloc(exit.length * 8);
      exit.forEach((v, i) => b.writeDoubleLE(v, 8 * i));
      const f = this.file(bundleId);
      writeFileSync(`${f}.${process.pid}.tmp`, b);
      renameSync(`${f}.${process.pid}.tmp`, f);
    } catch { /* a cache that cannot be written only costs time */ }
  }
}
