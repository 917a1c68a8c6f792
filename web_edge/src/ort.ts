/**
 * onnxruntime-web, loaded once and on first use (a page that never privatizes never loads it).
 *
 * `#ort` (package.json "imports") is onnxruntime-web's WebAssembly-only build in a browser
 * (`onnxruntime-web/wasm`: no WebGPU/WebNN code, half the WebAssembly of the default build)
 * and its Node build under Node. Everything here runs on the WebAssembly (CPU) backend.
 */

export type Ort = typeof import("onnxruntime-web");
let ortModule: Promise<Ort> | null = null;

/** onnxruntime-web; the number of WebAssembly threads is fixed by the first call that starts
 * it (a page needs cross-origin isolation for more than one). */
export function loadOrt(threads = 1): Promise<Ort> {
  ortModule ??= (import("#ort") as Promise<Ort>).then((ort) => {
    ort.env.wasm.numThreads = Math.max(1, Math.floor(threads));
    ort.env.logLevel = "error";
    return ort;
  });
  return ortModule;
}
