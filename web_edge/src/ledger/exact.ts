/**
 * Exactly rounded arithmetic both edges share to the last bit: Python's ``math.fsum``, and the
 * table's diameter D as shared.accounting.dchi_diameter_bound computes it. A leaf module (no
 * imports), so the bundle can compute D without the ledger.
 */

/** Exactly rounded sum (Shewchuk's algorithm, as Python's math.fsum). */
export function fsum(xs: number[]): number {
  const partials: number[] = [];
  for (let x of xs) {
    let i = 0;
    for (let y of partials) {
      if (Math.abs(x) < Math.abs(y)) [x, y] = [y, x];
      const hi = x + y;
      const lo = y - (hi - x);
      if (lo !== 0) partials[i++] = lo;
      x = hi;
    }
    partials.length = i;
    partials.push(x);
  }
  let hi = 0;
  let n = partials.length;
  if (n > 0) {
    hi = partials[--n]!;
    let lo = 0;
    while (n > 0) {
      const x = hi;
      const y = partials[--n]!;
      hi = x + y;
      lo = y - (hi - x);
      if (lo !== 0) break;
    }
    if (n > 0 && ((lo < 0 && partials[n - 1]! < 0) || (lo > 0 && partials[n - 1]! > 0))) {
      const y = lo * 2;
      const x = hi + y;
      if (y === x - hi) hi = x;
    }
  }
  return hi;
}

/**
 * D = 2 max‖φ(x)‖ over ``rows`` of a row-major float32 table (shared.accounting
 * .dchi_diameter_bound; Qu et al. §3.2: ηD bounds the dχ ε between any two tokens). Exact:
 * every ‖φ‖² is the correctly rounded sum of its float64 squares (exact for float32 values),
 * taken by {@link fsum} on the rows whose plain float64 sum lies within the summation error
 * of the largest, so the Python edge and this one charge the same D. ``norms2``: those plain
 * sums, where the caller has them (any order of summing: the margin covers it).
 */
export function diameter(table: Float32Array, dim: number, rows: ArrayLike<number>,
                         norms2?: ArrayLike<number>): number {
  if (rows.length === 0 || dim === 0) return 0;
  const plain = (v: number): number => {
    if (norms2 !== undefined) return norms2[v]!;
    let s = 0;
    for (let k = v * dim; k < (v + 1) * dim; k++) s += table[k]! * table[k]!;
    return s;
  };
  const approx = new Float64Array(rows.length);
  let top = -Infinity;
  for (let j = 0; j < rows.length; j++) {
    const s = plain(rows[j]!);
    if (Number.isNaN(s)) return NaN;
    approx[j] = s;
    if (s > top) top = s;
  }
  if (!Number.isFinite(top)) return top > 0 ? Infinity : NaN;
  // any order of summing n non-negative rounded squares is within about (n + 1) u of the exact
  // sum (u = 2^-53): 4 (n + 1) u is a safe margin
  const floor = top * (1 - 4 * (dim + 1) * 2 ** -53);
  let best = 0;
  const sq: number[] = new Array<number>(dim);
  for (let j = 0; j < rows.length; j++) {
    if (approx[j]! < floor) continue;
    const o = rows[j]! * dim;
    for (let k = 0; k < dim; k++) sq[k] = table[o + k]! * table[o + k]!;
    const s = fsum(sq);
    if (s > best) best = s;
  }
  return 2 * Math.sqrt(best);
}
