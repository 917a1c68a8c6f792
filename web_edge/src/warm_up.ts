/** Starting onnxruntime-web early (a page: at load, while the bundle downloads). */

import { integerGemmChecked } from "./int8_pass.js";
import { configureRuntime, loadOrt, type WasmPaths } from "./ort.js";
import { measure, now } from "./timing.js";

let warm: Promise<void> | null = null;

export interface WarmUpOptions {
  /** WebAssembly threads (more than one needs cross-origin isolation) */
  threads?: number;
  /** the table width the integer kernel is probed for (the bundle's dim) */
  dim?: number;
  /** where the page serves onnxruntime-web's WebAssembly (see `configureRuntime`) */
  wasmPaths?: WasmPaths | null;
}

/**
 * Start onnxruntime-web now: load its code and WebAssembly, start its runtime and probe its
 * integer kernel for tables of ``dim`` columns (what the first exact search otherwise waits
 * for; a bundle of another width is probed again when it arrives). Errors are left to the
 * first real use (where a WebAssembly that cannot be loaded is a `RuntimeLoadError` naming
 * its URL). ``warmUp(2)`` is ``warmUp({ threads: 2 })``.
 */
export function warmUp(threadsOrOptions: number | WarmUpOptions = 1, dim = 384): Promise<void> {
  const o: WarmUpOptions = typeof threadsOrOptions === "number" ? { threads: threadsOrOptions, dim } : threadsOrOptions;
  if (o.wasmPaths !== undefined) configureRuntime({ wasmPaths: o.wasmPaths });
  const t0 = now();
  warm ??= loadOrt(o.threads ?? 1).then(async (ort) => {
    await integerGemmChecked(ort, false, o.dim ?? 384);
    measure("onnxruntime-start", t0);
  }).catch(() => undefined);
  return warm;
}
