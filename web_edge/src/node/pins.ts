/**
 * The Node edge's bundle pins: `pins.json` beside the bundle cache (`$PRIVBERT_CACHE`), the
 * Python edge's file (edge_agent/service/pins.py): `{"version": 1, "pins": {key: bundle_id}}`,
 * written atomically (a temporary file, mode 0600, renamed into place), under the ledger's rules
 * (issue 42): one others can write is refused, one they can read is warned about, a symlink is
 * resolved once (its target is read and replaced). A file that cannot be read as pins is an
 * error, never a silent fresh start.
 */

import { closeSync, mkdirSync, openSync, readFileSync, realpathSync, renameSync, rmSync, statSync, writeSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { dirname, join } from "node:path";

import type { PinStore } from "../service/pins.js";
import { pyString } from "../format/pyjson.js";
import { DEVICE } from "../generated/spec.js";
import { cacheRoot } from "./caches.js";

export const PINS_FILE: string = DEVICE.cache.pins_file;
const BUNDLE_ID = /^[0-9a-f]{64}$/;

/** The pins file's text as Python's json.dump(indent=1, sort_keys=True) writes it. */
function dumps(pins: Record<string, string>): string {
  const keys = Object.keys(pins).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  const body = keys.length === 0 ? "{}"
    : `{\n${keys.map((k) => `  ${pyString(k)}: ${pyString(pins[k]!)}`).join(",\n")}\n }`;
  return `{\n "pins": ${body},\n "version": 1\n}`;
}

/** ``path`` with its symlinks resolved, when it exists (a missing file is created there). */
function resolved(path: string): string {
  try {
    return realpathSync(path);
  } catch {
    return path;
  }
}

export class FilePinStore implements PinStore {
  readonly where: string;
  readonly path: string;

  constructor(path: string = join(cacheRoot(), PINS_FILE),
              private readonly warn: (msg: string) => void = () => undefined) {
    this.path = resolved(path);
    this.where = this.path;
  }

  /** Refuse pins others can write (they could pin a bundle of theirs), warn about pins they
   * can read (which services this device uses): edge_agent/service/pins.py's rules. */
  private checkPrivate(): void {
    let mode: number;
    try {
      mode = statSync(this.path).mode & 0o777;
    } catch {
      return;
    }
    if (mode & 0o022) {
      throw new Error(`${this.path}: the bundle pins are writable by others (mode ${mode.toString(8)}): another user `
        + `could pin a bundle of theirs; chmod 600 ${this.path}`);
    }
    if (mode & 0o044) {
      this.warn(`${this.path}: the bundle pins are readable by others (mode ${mode.toString(8)}): they can see `
        + `which services this device uses; chmod 600 ${this.path}`);
    }
  }

  /** Every pin; an Error (one line, the Python edge's words) for a file that is not pins. */
  read(): Record<string, string> {
    this.checkPrivate();
    let raw: string;
    try {
      raw = readFileSync(this.path, "utf-8");
    } catch (exc) {
      const code = (exc as NodeJS.ErrnoException).code;
      if (code === "ENOENT") return {};
      throw new Error(`${this.path}: the bundle pins cannot be read (${code ?? (exc as Error).message})`);
    }
    let pins: unknown;
    try {
      const data = JSON.parse(raw) as { version?: unknown; pins?: unknown };
      pins = data.pins;
      if (data.version !== 1 || typeof pins !== "object" || pins === null || Array.isArray(pins)
          || !Object.values(pins).every((v) => typeof v === "string" && BUNDLE_ID.test(v))) {
        throw new SyntaxError("not pins");
      }
    } catch {
      throw new Error(`${this.path}: not a privbert pins file; move it away to pin bundles afresh `
        + "(the next bundle each server names is accepted)");
    }
    return { ...(pins as Record<string, string>) };
  }

  async get(key: string): Promise<string | null> {
    return this.read()[key] ?? null;
  }

  async all(): Promise<Record<string, string>> {
    return this.read();
  }

  async put(key: string, bundleId: string): Promise<void> {
    const pins = this.read();
    pins[key] = bundleId;
    mkdirSync(dirname(this.path), { recursive: true });
    const tmp = join(dirname(this.path), `.pins.${randomBytes(6).toString("hex")}`);
    const fd = openSync(tmp, "wx", 0o600);
    try {
      try {
        writeSync(fd, dumps(pins));
      } finally {
        closeSync(fd);
      }
      renameSync(tmp, this.path);
    } catch (exc) {
      rmSync(tmp, { force: true });
      throw exc;
    }
  }
}
