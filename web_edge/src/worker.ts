/**
 * `@privbert/edge/worker`: the Worker side of `EdgeSession.open({ worker })`. Imported by a
 * module Worker's script, it answers the session's messages (src/session/worker_protocol.ts): it
 * downloads and verifies the bundle, builds the exact search and checks the privacy floor,
 * and privatizes, all off the page's main thread, so that typing stays smooth while the table
 * is prepared. The page's script for it is one line:
 *
 *     // privbert-worker.js
 *     import "@privbert/edge/worker";
 *
 *     // the page
 *     const worker = new Worker(new URL("./privbert-worker.js", import.meta.url), { type: "module" });
 *     const s = await EdgeSession.open({ server, apiKey, worker });
 *
 * The device ledger stays in the page (the session charges it there before anything is
 * sent); the worker keeps verified bundles in the Cache API and the floor's distances in
 * IndexedDB when the session asks for caches. It sends only what the page's thread would:
 * GET /v1/bundles/{id}; never a text.
 */

import { CacheApiBundleCache, IndexedDbTextFloorCache } from "./session/browser_stores.js";
import { PrivbertClient, type ClientOptions } from "./service/client.js";
import { openLocal, type LocalEngine, type PlainPrivatizerOptions } from "./session/engine.js";
import { configureRuntime, type WasmPaths } from "./runtime/ort.js";
import { plainError, type Reply, type Request } from "./session/worker_protocol.js";

/** What `open` carries: the service, the bundle, the privatizer's options. */
export interface OpenArgs {
  server: string;
  apiKey: string | null;
  client: Pick<ClientOptions, "timeout" | "retries">;
  bundleId: string;
  options: PlainPrivatizerOptions;
  /** keep verified bundles in the Cache API */
  bundleCache: boolean;
  /** keep an unverified bundle's passed text floor in IndexedDB, signed */
  textFloorCache?: boolean;
  wasmPaths: WasmPaths | null;
}

interface Scope {
  postMessage(message: Reply): void;
  addEventListener(type: "message", listener: (ev: MessageEvent<Request>) => void): void;
}

let engine: LocalEngine | null = null;

async function handle(req: Request, scope: Scope): Promise<unknown> {
  switch (req.op) {
    case "open": {
      const a = req.args as OpenArgs;
      await engine?.close();
      engine = null;
      if (a.wasmPaths !== null) configureRuntime({ wasmPaths: a.wasmPaths });
      const client = new PrivbertClient(a.server, { apiKey: a.apiKey, ...a.client });
      engine = await openLocal(client, a.bundleId, {
        ...a.options,
        bundleCache: a.bundleCache ? new CacheApiBundleCache() : null,
        textFloorCache: a.textFloorCache ? new IndexedDbTextFloorCache() : null,
        onProgress: (progress) => scope.postMessage({ id: req.id, progress }),
      });
      return engine.info;
    }
    case "privatize":
      return need().privatize((req.args as { texts: string[] }).texts);
    case "decode":
      return need().decode((req.args as { ids: number[][] }).ids);
    case "close":
      await engine?.close();
      engine = null;
      return null;
    default:
      throw new RangeError(`unknown request ${JSON.stringify(req.op)} to the privbert worker`);
  }
}

function need(): LocalEngine {
  if (engine === null) throw new Error("the privbert worker has no bundle open (EdgeSession.open first)");
  return engine;
}

/** Answer the session's messages in ``scope`` (the worker's global scope). */
export function serveWorker(scope: Scope = globalThis): void {
  scope.addEventListener("message", (ev) => {
    const req = ev.data;
    if (!req || typeof req.id !== "number" || typeof req.op !== "string") return;  // not ours
    handle(req, scope).then(
      (value) => scope.postMessage({ id: req.id, ok: true, value }),
      (exc: unknown) => scope.postMessage({ id: req.id, ok: false, error: plainError(exc) }),
    );
  });
}

const g = globalThis as { WorkerGlobalScope?: unknown; document?: unknown };
if (typeof g.WorkerGlobalScope === "function" && g.document === undefined
    && globalThis instanceof (g.WorkerGlobalScope as typeof Object)) {
  serveWorker();
}
