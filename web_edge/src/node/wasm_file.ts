/** Where the library's own onnxruntime-web WebAssembly lies on disk, for a build script that
 * copies it beside a page's bundle (esbuild and Rollup leave it where it is):
 *
 *     import { copyFileSync } from "node:fs";
 *     import { ortWasmPath } from "@privbert/edge/node";
 *     copyFileSync(ortWasmPath(), "dist/ort-wasm-simd-threaded.wasm");   // beside dist/page.js
 */

import { createRequire } from "node:module";

import { WASM_FILE } from "../runtime/ort.js";

/** The absolute path of `ort-wasm-simd-threaded.wasm` of the onnxruntime-web this package
 * depends on (resolved from this package, so never another copy in the app). */
export function ortWasmPath(): string {
  return createRequire(import.meta.url).resolve(`onnxruntime-web/${WASM_FILE}`);
}
