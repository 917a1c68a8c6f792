/**
 * The device ledger in a file (Node): one JSON document, replaced atomically (written to a
 * temporary file, fsynced, renamed) inside a lock file, so that concurrent runs on one ledger
 * check and charge one after the other and never pass the cap together. The memo key is 32
 * random bytes in ``FILE.key`` (mode 0600), refused when others can read it. A ledger that
 * cannot be read or written makes the charge reject (nothing is sent).
 *
 * As edge-agent's ledger (edge_agent/budget/ledger_files.py): the path is reached through its
 * symlinks resolved once, so the target is charged (never replaced by a regular file) and its
 * key, lock and temporary files sit beside it; a ledger others can write is refused (another
 * local user could reset its spend or cap), one they can read is warned about, in the same words.
 */

import { closeSync, fsyncSync, openSync, readFileSync, readlinkSync, realpathSync, renameSync, statSync,
  unlinkSync, writeSync, mkdirSync, linkSync, constants } from "node:fs";
import { homedir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { emptyState, importHmacKey, type LedgerState, type LedgerStore } from "../ledger/ledger.js";

export const LEDGER_ENV = "PRIVBERT_EDGE_LEDGER";
const KEY_BYTES = 32;

/** $PRIVBERT_EDGE_LEDGER, else edge-ledger.json in $XDG_DATA_HOME/privbert (~/.local/share). */
export function defaultLedgerPath(): string {
  const env = process.env[LEDGER_ENV];
  if (env) return env;
  const data = process.env.XDG_DATA_HOME || join(homedir(), ".local", "share");
  return join(data, "privbert", "edge-ledger.json");
}

/** A ledger file refused for what it is (a directory, writable by others): its message says why. */
export class LedgerFileError extends Error {
  override name = "LedgerFileError";
}

/** ``path`` with every symlink resolved, also where the file (or a folder above it) does not
 * exist yet: a dangling link is followed to where its target will be (os.path.realpath). */
export function resolvedPath(path: string, depth = 0): string {
  const abs = resolve(path);
  try {
    return realpathSync(abs);
  } catch (exc) {
    if ((exc as NodeJS.ErrnoException).code !== "ENOENT" || depth > 40) throw exc;
  }
  let target: string | null = null;
  try {
    target = readlinkSync(abs);
  } catch (exc) {
    const code = (exc as NodeJS.ErrnoException).code;
    if (code !== "ENOENT" && code !== "EINVAL") throw exc;
  }
  if (target !== null) return resolvedPath(resolve(dirname(abs), target), depth + 1);
  const parent = dirname(abs);
  return parent === abs ? abs : join(resolvedPath(parent, depth + 1), basename(abs));
}

/** Refuse a ledger file others can write (with the one-line fix); the warning for one they can
 * read (null: private, or missing). edge_agent.budget.ledger_files.check_private's words. */
export function checkPrivate(path: string): string | null {
  let mode: number;
  try {
    mode = statSync(path).mode & 0o7777;
  } catch (exc) {
    if ((exc as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw exc;
  }
  if (mode & 0o022) {
    throw new LedgerFileError(`${path}: the privacy ledger is writable by others (mode ${mode.toString(8)}): `
      + `another user could reset its spend or cap; chmod 600 ${path}`);
  }
  if (mode & 0o044) {
    return `${path}: the privacy ledger is readable by others (mode ${mode.toString(8)}): they can see `
      + `what this device sent and when; chmod 600 ${path}`;
  }
  return null;
}

export class FileLedgerStore implements LedgerStore {
  readonly where: string;
  /** The ledger file, its symlinks resolved (the path given, where that fails). */
  readonly path: string;
  private key: Promise<CryptoKey> | null = null;

  constructor(path: string, private readonly lockTimeoutMs = 60_000) {
    let real = path;
    try {
      real = resolvedPath(path);
    } catch { /* open() and every read say why */ }
    this.path = real;
    this.where = real;
  }

  /** Check that the ledger can be opened (its folder made, mode 0700; the file readable, not
   * writable by others); returns the warning for one others can read (null: none). */
  open(): string | null {
    try {
      if (statSync(this.path, { throwIfNoEntry: false })?.isDirectory()) {
        throw new LedgerFileError(`${this.path}: is a directory, not a privacy ledger file (--ledger FILE)`);
      }
      const warning = checkPrivate(this.path);
      mkdirSync(dirname(this.path), { recursive: true, mode: 0o700 });
      this.readSync();
      return warning;
    } catch (exc) {
      if (exc instanceof LedgerFileError) throw exc;
      throw new Error(`${this.path}: cannot open the privacy ledger (${(exc as Error).message})`);
    }
  }

  private readSync(): LedgerState {
    let text: string;
    try {
      text = readFileSync(this.path, "utf8");
    } catch (exc) {
      if ((exc as NodeJS.ErrnoException).code === "ENOENT") return emptyState();
      throw exc;
    }
    const s = JSON.parse(text) as LedgerState;
    if (s.format !== "privbert-edge-ledger" || s.version !== 1) throw new Error("not a privbert-edge ledger file");
    return s;
  }

  async read(): Promise<LedgerState> {
    return this.readSync();
  }

  private async lock(): Promise<() => void> {
    const lockPath = `${this.path}.lock`;
    const deadline = Date.now() + this.lockTimeoutMs;
    let delay = 5;
    for (;;) {
      try {
        const fd = openSync(lockPath, "wx", 0o600);
        closeSync(fd);
        return () => unlinkSync(lockPath);
      } catch (exc) {
        if ((exc as NodeJS.ErrnoException).code !== "EEXIST") throw exc;
        if (Date.now() > deadline) throw new Error(`locked by another run (${lockPath}); remove it if no run is going on`);
        await sleep(delay);
        delay = Math.min(delay * 2, 100);
      }
    }
  }

  async update<T>(fn: (s: LedgerState) => { state: LedgerState | null; result: T }): Promise<T> {
    mkdirSync(dirname(this.path), { recursive: true, mode: 0o700 });
    const unlock = await this.lock();
    try {
      checkPrivate(this.path);
      const { state, result } = fn(this.readSync());
      if (state !== null) this.writeSync(state);
      return result;
    } finally {
      unlock();
    }
  }

  private writeSync(state: LedgerState): void {
    const tmp = `${this.path}.${process.pid}.tmp`;
    const fd = openSync(tmp, "w", 0o600);
    try {
      writeSync(fd, JSON.stringify(state));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, this.path);
    try {
      const dfd = openSync(dirname(this.path), constants.O_RDONLY);
      try { fsyncSync(dfd); } finally { closeSync(dfd); }
    } catch { /* some file systems cannot fsync a directory */ }
  }

  hmacKey(): Promise<CryptoKey> {
    this.key ??= importHmacKey(this.loadKey());
    return this.key;
  }

  /** The memo key file, made (atomically, mode 0600) when missing. */
  private loadKey(): Uint8Array {
    const path = `${this.path}.key`;
    try {
      return this.readKey(path);
    } catch (exc) {
      if ((exc as NodeJS.ErrnoException).code !== "ENOENT") throw exc;
    }
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
    const tmp = `${path}.${process.pid}.tmp`;
    const fd = openSync(tmp, "wx", 0o600);
    try {
      writeSync(fd, crypto.getRandomValues(new Uint8Array(KEY_BYTES)));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    try {
      linkSync(tmp, path); // fails if another run made it first: then theirs is used
    } catch (exc) {
      if ((exc as NodeJS.ErrnoException).code !== "EEXIST") throw exc;
    } finally {
      unlinkSync(tmp);
    }
    return this.readKey(path);
  }

  private readKey(path: string): Uint8Array {
    const st = statSync(path);
    if (st.mode & 0o077) {
      throw new Error(`${path}: the ledger's memo key is readable by others (mode ${(st.mode & 0o777).toString(8)}); chmod 600 it`);
    }
    const data = readFileSync(path);
    if (data.length !== KEY_BYTES) {
      throw new Error(`${path}: not a ledger memo key (${data.length} bytes, expected ${KEY_BYTES})`);
    }
    return new Uint8Array(data);
  }
}
