/**
 * The product of query rows with the augmented embedding table, the cost of the exact
 * nearest-token search: `S (m × V) = Y (m × w) · Aᵀ` with A (V × w) the table stored as
 * [-2t, ‖t‖², 0 …] (shared/mechanisms/nearest.py). Two implementations of one interface:
 * onnxruntime-web's WebAssembly MatMul (SIMD; browsers and Node) and a plain loop (small
 * tables, tests, and where WebAssembly is not available). Both compute in float32; the error
 * bound of the search holds for any summation order, so either is exact after the re-rank.
 */

import { matmulModel } from "./onnx_model.js";

export interface TableProduct {
  /** Rows of the table (V) and the width of a row (w). */
  readonly rows: number;
  readonly width: number;
  /** S = Y · Aᵀ for ``m`` query rows ``y`` (m × w, row-major float32); m × V float32. */
  run(y: Float32Array, m: number): Promise<Float32Array>;
  /** Free what it holds (the WebAssembly session). */
  release(): Promise<void>;
}

/** The plain-loop product: for small tables (a vocabulary-sized table is the WebAssembly
 * MatMul's work: {@link OrtTableProduct}; bench/web_edge.py times it). */
export class LoopTableProduct implements TableProduct {
  constructor(private readonly table: Float32Array, readonly rows: number, readonly width: number) {}

  async run(y: Float32Array, m: number): Promise<Float32Array> {
    const { rows, width, table } = this;
    const out = new Float32Array(m * rows);
    for (let i = 0; i < m; i++) {
      const yi = y.subarray(i * width, (i + 1) * width);
      for (let v = 0; v < rows; v++) {
        let s = 0;
        const o = v * width;
        for (let k = 0; k < width; k++) s += yi[k]! * table[o + k]!;
        out[i * rows + v] = s; // float64 sum rounded once: within the float32 bound
      }
    }
    return out;
  }

  async release(): Promise<void> {}
}

/** Options of the onnxruntime-web product. */
export interface OrtOptions {
  /** WebAssembly threads (a page needs cross-origin isolation for more than one); default 1. */
  threads?: number;
}

type Ort = typeof import("onnxruntime-web");
let ortModule: Promise<Ort> | null = null;

/** onnxruntime-web, loaded once, on first use (pages that never privatize never load it). */
export function loadOrt(): Promise<Ort> {
  ortModule ??= import("onnxruntime-web");
  return ortModule;
}

/** The product by onnxruntime-web's MatMul on its WebAssembly backend. */
export class OrtTableProduct implements TableProduct {
  private constructor(private readonly ort: Ort,
                      private readonly session: import("onnxruntime-web").InferenceSession,
                      readonly rows: number, readonly width: number) {}

  /** Build the session for the augmented ``table`` (rows × width, row-major float32). */
  static async create(table: Float32Array, rows: number, width: number,
                      options: OrtOptions = {}): Promise<OrtTableProduct> {
    const ort = await loadOrt();
    ort.env.wasm.numThreads = Math.max(1, Math.floor(options.threads ?? 1));
    ort.env.logLevel = "error";
    // B = Aᵀ (width × rows): the model's initializer is the transposed table
    const b = new Float32Array(rows * width);
    for (let v = 0; v < rows; v++) {
      for (let k = 0; k < width; k++) b[k * rows + v] = table[v * width + k]!;
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
