/**
 * The page's side of a session whose privatization runs in a Worker (src/worker.ts): each
 * call is one message, answered in order of arrival; the Worker's errors come back as the
 * library's own classes (src/session/worker_protocol.ts). A Worker that cannot start (its script not
 * served, a syntax error) fails every call with one message saying so.
 */

import type { ProgressCallback } from "../service/client.js";
import type { Engine, EngineInfo, EngineOutput } from "./engine.js";
import type { BitSource } from "../random/random.js";
import type { OpenArgs } from "../worker.js";
import { revive, type Op, type Reply } from "./worker_protocol.js";

interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  onProgress?: ProgressCallback | null;
}

export class RemoteEngine implements Engine {
  private next = 1;
  private readonly pending = new Map<number, Pending>();
  private broken: Error | null = null;
  info!: EngineInfo;

  private constructor(private readonly worker: Worker) {
    worker.addEventListener("message", (ev: MessageEvent<Reply>) => {
      const m = ev.data;
      const p = m && typeof m.id === "number" ? this.pending.get(m.id) : undefined;
      if (!p) return;
      if ("progress" in m) {
        p.onProgress?.(m.progress as Parameters<ProgressCallback>[0]);
        return;
      }
      this.pending.delete(m.id);
      if (m.ok) p.resolve(m.value);
      else p.reject(revive(m.error));
    });
    worker.addEventListener("error", (ev: ErrorEvent) => {
      ev.preventDefault?.();
      this.fail(new Error(`the privbert Worker failed (${ev.message || "its script could not be loaded"}): `
        + 'is its script, which imports "@privbert/edge/worker", built and served as a module Worker?'));
    });
    worker.addEventListener("messageerror", () => this.fail(new Error("the privbert Worker sent a message that cannot be read")));
  }

  private fail(err: Error): void {
    this.broken = err;
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
  }

  private call<T>(op: Op, args: unknown, onProgress?: ProgressCallback | null): Promise<T> {
    if (this.broken) return Promise.reject(this.broken);
    const id = this.next++;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject, onProgress });
      this.worker.postMessage({ id, op, args });
    });
  }

  /** Open the bundle and the privatizer in ``worker``. */
  static async open(worker: Worker, args: OpenArgs, onProgress?: ProgressCallback | null): Promise<RemoteEngine> {
    const e = new RemoteEngine(worker);
    e.info = await e.call<EngineInfo>("open", args, onProgress);
    return e;
  }

  privatize(texts: string[], source?: BitSource | null): Promise<EngineOutput> {
    if (source) {
      return Promise.reject(new RangeError("a seeded BitSource cannot be passed to a session in a Worker "
        + "(open the session without worker for seeded runs)"));
    }
    return this.call<EngineOutput>("privatize", { texts });
  }

  decode(ids: number[][]): Promise<string[]> {
    return this.call<string[]>("decode", { ids });
  }

  async close(): Promise<void> {
    if (!this.broken) await this.call("close", null).catch(() => undefined);
  }
}
