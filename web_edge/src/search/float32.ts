/** float32 steps for the proven bounds of the exact search (numpy's np.nextafter on float32). */

const F32 = new Float32Array(1);
const U32V = new Uint32Array(F32.buffer);

/** The smallest float32 strictly above the float32 value ``x`` (np.nextafter(x, inf)); ``x`` is
 * first rounded to float32. */
export function nextUpF32(x: number): number {
  F32[0] = x;
  const v = F32[0];
  if (v === Infinity || Number.isNaN(v)) return v;
  if (v === 0) {
    U32V[0] = 1;
    return F32[0];
  }
  if (v > 0) U32V[0] = U32V[0]! + 1;
  else U32V[0] = U32V[0]! - 1;
  return F32[0];
}

/** The smallest float32 >= ``x`` (shared.mechanisms.int8_pass.f32_up). */
export function f32Up(x: number): number {
  const r = Math.fround(x);
  return r < x ? nextUpF32(r) : r;
}
