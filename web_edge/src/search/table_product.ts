/**
 * The product of query rows with the augmented embedding table, the cost of the exact
 * nearest-token search: `S (m × V) = Y (m × w) · Aᵀ` with A (V × w) the table stored as
 * [-2t, ‖t‖², 0 …] (shared/mechanisms/nearest.py). Two implementations of one interface:
 * onnxruntime-web's WebAssembly MatMul (SIMD; browsers and Node) and a plain loop (small
 * tables, the int8 pass's fallback queries, tests). Both compute in float32; the error
 * bound of the search holds for any summation order, so either is exact after the re-rank.
 */

import { matmulModel } from "../runtime/onnx_model.js";
import { loadOrt, type Ort } from "../runtime/ort.js";

export interface TableProduct {
  /** Rows of the table (V) and the width of a row (w). */
  readonly rows: number;
  readonly width: number;
  /** S = Y · Aᵀ for ``m`` query rows ``y`` (m × w, row-major float32); m × V float32. */
  run(y: Float32Array, m: number): Promise<Float32Array>;
  /** Free what it holds (the WebAssembly session). */
  release(): Promise<void>;
}

/** The plain-loop product, read straight from the table and its norms (no augmented copy):
 * for small tables (rows × dim below nearest.ts's LARGE_WORK: no onnxruntime-web to load) and
 * for the few queries the int8 pass hands back. Four queries share each pass over a table row
 * (the row is read once for them: about twice the speed of one query at a time); each score is
 * the same sum, in the same order, as one query alone gives. */
export class LoopTableProduct implements TableProduct {
  constructor(private readonly table: Float32Array, private readonly norms: Float64Array,
              readonly rows: number, private readonly dim: number, readonly width: number) {}

  async run(y: Float32Array, m: number): Promise<Float32Array> {
    const { rows, dim, width, table, norms } = this;
    const out = new Float32Array(m * rows);
    let i = 0;
    for (; i + 4 <= m; i += 4) {
      const a = i * width;
      const b = a + width;
      const c = b + width;
      const d = c + width;
      const na = y[a + dim]!;
      const nb = y[b + dim]!;
      const nc = y[c + dim]!;
      const nd = y[d + dim]!;
      for (let v = 0; v < rows; v++) {
        let s0 = 0;
        let s1 = 0;
        let s2 = 0;
        let s3 = 0;
        const o = v * dim;
        for (let k = 0; k < dim; k++) {
          const t = table[o + k]!;
          s0 += y[a + k]! * t;
          s1 += y[b + k]! * t;
          s2 += y[c + k]! * t;
          s3 += y[d + k]! * t;
        }
        const n = norms[v]!;
        const w = i * rows + v;
        // float64, rounded once: within the float32 bound
        out[w] = na * n - 2 * s0;
        out[w + rows] = nb * n - 2 * s1;
        out[w + 2 * rows] = nc * n - 2 * s2;
        out[w + 3 * rows] = nd * n - 2 * s3;
      }
    }
    for (; i < m; i++) {
      const a = i * width;
      const na = y[a + dim]!;
      for (let v = 0; v < rows; v++) {
        let s = 0;
        const o = v * dim;
        for (let k = 0; k < dim; k++) s += y[a + k]! * table[o + k]!;
        out[i * rows + v] = na * norms[v]! - 2 * s;
      }
    }
    return out;
  }

  async release(): Promise<void> {}
}

/** Options of the onnxruntime-web products. */
export interface OrtOptions {
  /** WebAssembly threads (a page needs cross-origin isolation for more than one); default 1.
   * Fixed by the first use of onnxruntime-web in the page or process. */
  threads?: number;
}

/** The product by onnxruntime-web's MatMul on its WebAssembly backend. */
export class OrtTableProduct implements TableProduct {
  private constructor(private readonly ort: Ort,
                      private readonly session: import("onnxruntime-web").InferenceSession,
                      readonly rows: number, readonly width: number) {}

  /** The session for the table (rows × dim, row-major float32) with row norms² ``norms``: its
   * initializer B = Aᵀ (width × rows) is written from the table in one pass. */
  static async create(table: Float32Array, norms: Float64Array, rows: number, dim: number, width: number,
                      options: OrtOptions = {}): Promise<OrtTableProduct> {
    const ort = await loadOrt(options.threads ?? 1);
    const b = new Float32Array(rows * width);
    for (let v = 0; v < rows; v++) {
      const o = v * dim;
      for (let k = 0; k < dim; k++) b[k * rows + v] = -2 * table[o + k]!; // exact: a power of two
      b[dim * rows + v] = norms[v]!;
    }
    const session = await ort.InferenceSession.create(matmulModel(b, width, rows), {
      executionProviders: ["wasm"], graphOptimizationLevel: "all",
    });
    return new OrtTableProduct(ort, session, rows, width);
  }

  async run(y: Float32Array, m: number): Promise<Float32Array> {
    const input = new this.ort.Tensor("float32", y.subarray(0, m * this.width), [m, this.width]);
    const out = await this.session.run({ Y: input });
    const s = out.S!;
    const data = s.data as Float32Array;
    s.dispose?.();
    return data;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}
