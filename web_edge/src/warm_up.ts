/** Starting onnxruntime-web early (a page: at load, while the bundle downloads). */

import { integerGemmChecked } from "./int8_pass.js";
import { loadOrt } from "./ort.js";
import { measure, now } from "./timing.js";

let warm: Promise<void> | null = null;

/**
 * Start onnxruntime-web now: load its code and WebAssembly, start its runtime and probe its
 * integer kernel for tables of ``dim`` columns (what the first exact search otherwise waits
 * for; a bundle of another width is probed again when it arrives). Errors are left to the
 * first real use.
 */
export function warmUp(threads = 1, dim = 384): Promise<void> {
  const t0 = now();
  warm ??= loadOrt(threads).then(async (ort) => {
    await integerGemmChecked(ort, false, dim);
    measure("onnxruntime-start", t0);
  }).catch(() => undefined);
  return warm;
}
