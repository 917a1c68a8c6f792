/**
 * onnxruntime-web, loaded once and on first use (a page that never privatizes never loads it).
 *
 * `#ort` (package.json "imports") is onnxruntime-web's WebAssembly-only build in a browser
 * (`onnxruntime-web/wasm`: no WebGPU/WebNN code, half the WebAssembly of the default build)
 * and its Node build under Node. Everything here runs on the WebAssembly (CPU) backend.
 *
 * Where its WebAssembly comes from: onnxruntime-web asks for `ort-wasm-simd-threaded.wasm`
 * beside its own script (`new URL(..., import.meta.url)`), which Vite and webpack 5 turn into
 * an emitted asset; esbuild and Rollup leave it as is, so the file must lie beside the output
 * script, or {@link configureRuntime} (`wasmPaths`, also an option of `EdgeSession.open` and
 * `warmUp`) names where the page serves it. This module sets it on the library's own copy of
 * onnxruntime-web, the one that runs. When the file cannot be loaded, {@link loadOrt} fails
 * with a {@link RuntimeLoadError} naming the URL it tried, what came back, and the fix.
 */

import { RuntimeLoadError } from "../errors.js";
import { matmulModel } from "./onnx_model.js";

export type Ort = typeof import("onnxruntime-web");

/** Where onnxruntime-web's files are: a URL prefix (a folder, ending in "/"), or the URL of
 * the `.wasm` file itself (onnxruntime-web's `env.wasm.wasmPaths`). */
export type WasmPaths = string | { wasm?: string | URL; mjs?: string | URL };

/** The WebAssembly file of the build `#ort` resolves to in a browser. */
export const WASM_FILE = "ort-wasm-simd-threaded.wasm";

let ortModule: Promise<Ort> | null = null;
let ortStarted = false;
let wasmPaths: WasmPaths | null = null;

/** Whether onnxruntime-web has started in this page or process (a search may switch to it
 * now at no download), or costs no download to start (Node: its files are local). */
export function ortAtHand(): boolean {
  const g = globalThis as { process?: { versions?: { node?: string } }; document?: unknown };
  return ortStarted || (typeof g.process?.versions?.node === "string" && g.document === undefined);
}

/**
 * Where the page serves onnxruntime-web's WebAssembly (see the module's comment): call before
 * the first privatization (or `warmUp`). A string ending in "/" is a folder; any other string,
 * or `{ wasm }`, is the file's URL. Setting it again to another value once the runtime has
 * started is a RangeError (onnxruntime-web starts once per page).
 */
export function configureRuntime(options: { wasmPaths?: WasmPaths | null }): void {
  const next = normalize(options.wasmPaths ?? null);
  if (ortModule !== null && JSON.stringify(next) !== JSON.stringify(wasmPaths)) {
    throw new RangeError("wasmPaths must be set before onnxruntime-web starts (before warmUp or "
      + "the first privatization); it is started already with "
      + (wasmPaths === null ? "its default location" : JSON.stringify(wasmPaths)));
  }
  wasmPaths = next;
}

function normalize(p: WasmPaths | null): WasmPaths | null {
  if (p === null || p === undefined) return null;
  if (typeof p === "string") {
    if (p === "") throw new RangeError("wasmPaths must be a URL or a folder URL ending in '/', got an empty string");
    // a folder: the file in it (a string prefix would make onnxruntime-web fetch its .mjs
    // glue from there too, which its bundled build carries already)
    return { wasm: p.endsWith("/") ? p + WASM_FILE : p };
  }
  if (typeof p !== "object" || (p.wasm === undefined && p.mjs === undefined)) {
    throw new RangeError(`wasmPaths must be a URL string or { wasm: URL }, got ${JSON.stringify(p)}`);
  }
  return { ...(p.wasm !== undefined ? { wasm: String(p.wasm) } : {}), ...(p.mjs !== undefined ? { mjs: String(p.mjs) } : {}) };
}

/** onnxruntime-web, started (its WebAssembly fetched and compiled); the number of WebAssembly
 * threads is fixed by the first call that starts it (a page needs cross-origin isolation for
 * more than one). A failed start is a {@link RuntimeLoadError}, and stays one: onnxruntime-web
 * starts at most once in a page, so the page must be reloaded once the file is served. */
export function loadOrt(threads = 1): Promise<Ort> {
  ortModule ??= start(threads).then((ort) => {
    ortStarted = true;
    return ort;
  });
  return ortModule;
}

async function start(threads: number): Promise<Ort> {
  const ort = await import("#ort");
  ort.env.wasm.numThreads = Math.max(1, Math.floor(threads));
  ort.env.logLevel = "error";
  if (wasmPaths !== null) ort.env.wasm.wasmPaths = wasmPaths;
  const seen: string[] = [];
  const unspy = spyWasmFetches(seen);
  try {
    // a one-value MatMul: creating any session starts the WebAssembly runtime
    const s = await ort.InferenceSession.create(matmulModel(new Float32Array([1]), 1, 1),
      { executionProviders: ["wasm"] });
    await s.release();
  } catch (exc) {
    throw await explainStart(exc, ort, seen);
  } finally {
    unspy();
  }
  return ort;
}

/** Note the URLs of `.wasm` files fetched while the runtime starts (onnxruntime-web's fetch
 * of its WebAssembly: the page cannot otherwise tell which URL it tried). Every call goes on
 * to the real fetch unchanged; the spy is removed once the runtime has started or failed. */
function spyWasmFetches(seen: string[]): () => void {
  const g = globalThis as { fetch?: typeof fetch; location?: { href: string } };
  const real = g.fetch;
  if (typeof real !== "function" || g.location === undefined) return () => undefined;
  const spy: typeof fetch = (input, init) => {
    const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
    if (/\.wasm(\?|#|$)/.test(url)) seen.push(new URL(url, g.location!.href).href);
    return real.call(globalThis, input, init);
  };
  g.fetch = spy;
  return () => {
    if (g.fetch === spy) g.fetch = real;  // a wrapper added meanwhile stays (it calls ours)
  };
}

/** The URL onnxruntime-web asked for its WebAssembly, as far as the page can tell. */
function triedUrl(seen: string[]): string | null {
  if (seen.length) return seen[seen.length - 1]!;
  if (wasmPaths !== null && typeof wasmPaths === "object" && wasmPaths.wasm !== undefined) {
    return new URL(String(wasmPaths.wasm), globalThis.location?.href).href;
  }
  return null;
}

/** What the URL gives now: a status, a type that is not WebAssembly, or no answer. */
async function probe(url: string): Promise<string> {
  try {
    const r = await fetch(url, { cache: "no-store" });
    if (!r.ok) return `the server answered ${r.status} ${r.statusText}`.trim();
    const head = new Uint8Array(await r.arrayBuffer()).subarray(0, 4);
    const magic = head.length === 4 && head[0] === 0 && head[1] === 0x61 && head[2] === 0x73 && head[3] === 0x6d;
    const type = r.headers.get("Content-Type") ?? "no Content-Type";
    if (!magic) return `what it serves there is not WebAssembly (${type})`;
    if (!/^application\/wasm\b/i.test(type)) return `it is served as ${type}, not application/wasm`;
    return "it can be fetched now, but the runtime failed to start from it";
  } catch (exc) {
    return `it could not be fetched (${(exc as Error).message}; blocked by the page's `
      + "Content-Security-Policy connect-src, by CORS, or not served)";
  }
}

async function explainStart(exc: unknown, ort: Ort, seen: string[]): Promise<Error> {
  const why = exc instanceof Error ? exc.message : String(exc);
  if (typeof document === "undefined" && typeof (globalThis as { WorkerGlobalScope?: unknown }).WorkerGlobalScope === "undefined") {
    return new RuntimeLoadError(`onnxruntime-web failed to start: ${why}`, null);  // Node: files, not URLs
  }
  const version = (ort.env.versions as { web?: string } | undefined)?.web ?? "";
  const url = triedUrl(seen);
  const what = url === null ? "onnxruntime-web's WebAssembly (" + WASM_FILE + ")" : url;
  const found = url === null ? "no request for it was seen" : await probe(url);
  const fix = `serve node_modules/onnxruntime-web/dist/${WASM_FILE} (onnxruntime-web${version ? "@" + version : ""}, `
    + "the copy @privbert/edge depends on) "
    + (wasmPaths === null ? "beside your bundled script, " : "at that URL, ")
    + "or pass wasmPaths (EdgeSession.open, warmUp or configureRuntime) with the URL where your page serves it";
  return new RuntimeLoadError(`cannot load onnxruntime-web's WebAssembly from ${what}: ${found}. Fix: ${fix}. `
    + `(onnxruntime-web said: ${why.split("\n")[0]!.slice(0, 200)})`, url);
}
