/** Starting onnxruntime-web early (a page: while the bundle downloads), where the bundle needs it. */

import type { BundleShape } from "../bundle/bundle.js";
import { integerGemmChecked } from "../search/int8_pass.js";
import { searchUsesOrt } from "../search/nearest.js";
import { configureRuntime, loadOrt, type WasmPaths } from "./ort.js";
import { usesEncoder } from "../mechanisms/specs.js";
import { measure, now } from "../timing.js";

let warm: Promise<void> | null = null;

export interface WarmUpOptions {
  /** WebAssembly threads (more than one needs cross-origin isolation) */
  threads?: number;
  /** the table width the integer kernel is probed for (the bundle's dim; default: shape's, or 384) */
  dim?: number;
  /** where the page serves onnxruntime-web's WebAssembly (see `configureRuntime`) */
  wasmPaths?: WasmPaths | null;
  /** the bundle being opened (`Progress.shape`, told as its download starts): with it, the
   * runtime starts only where that bundle needs it ({@link runtimeNeeded}) */
  shape?: BundleShape | null;
  /** the mechanism that will privatize (with ``shape``: default, any the bundle serves) */
  mechanism?: string | null;
}

/**
 * Whether privatizing with ``mechanism`` on a bundle of ``shape`` loads onnxruntime-web (its
 * WebAssembly: 2.4 MB brotli in a page): the sentence encoder of a sentence-vector mechanism, or an
 * exact search over a large table (nearest.ts's `searchUsesOrt`: a compact table's is plain JS).
 * Without a mechanism: a bundle with an encoder counts as needing it.
 */
export function runtimeNeeded(shape: BundleShape, mechanism?: string | null): boolean {
  const encoder = mechanism == null ? shape.encoder : usesEncoder(mechanism);
  return encoder || searchUsesOrt(shape.rows, shape.dim);
}

/**
 * Start onnxruntime-web now: load its code and WebAssembly, start its runtime and probe its
 * integer kernel for tables of ``dim`` columns (what the first exact search otherwise waits
 * for; a bundle of another width is probed again when it arrives). With ``shape``, nothing
 * starts where that bundle does not need the runtime (a compact table's dχ-text page fetches
 * no WebAssembly). A WebAssembly that cannot be loaded (a wrong ``wasmPaths``, a file the page
 * does not serve) rejects with a `RuntimeLoadError` naming the URL tried and the fix, whatever
 * the model; the probe's own failures are left to the search (which then keeps its float
 * pass). ``warmUp(2)`` is ``warmUp({ threads: 2 })``.
 */
export function warmUp(threadsOrOptions: number | WarmUpOptions = 1, dim = 384): Promise<void> {
  const o: WarmUpOptions = typeof threadsOrOptions === "number" ? { threads: threadsOrOptions, dim } : threadsOrOptions;
  if (o.wasmPaths !== undefined) configureRuntime({ wasmPaths: o.wasmPaths });
  if (o.shape && !runtimeNeeded(o.shape, o.mechanism)) return Promise.resolve();
  const t0 = now();
  warm ??= loadOrt(o.threads ?? 1).then(async (ort) => {
    await integerGemmChecked(ort, false, o.dim ?? o.shape?.dim ?? 384).catch(() => undefined);
    measure("onnxruntime-start", t0);
  });
  return warm;
}

/** {@link warmUp} for the library's own early starts: a failure shows where the runtime is
 * used (Privatizer.create's RuntimeLoadError), not here. */
export function warmUpQuietly(options: WarmUpOptions): void {
  warmUp(options).catch(() => undefined);
}
