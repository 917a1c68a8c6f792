/**
 * One-node ONNX models, written as protobuf bytes by hand: `S = Y @ B` with `B` a float32
 * initializer (the float32 candidate pass), and onnxruntime's `MatMulIntegerToFloat` (the int8
 * candidate pass). onnxruntime-web runs them with its WebAssembly (SIMD) kernels, which is what
 * makes the exact nearest-token search fast enough in a page (the table product is the cost).
 *
 * Only the few fields such a graph needs are written (onnx.proto3: ModelProto, GraphProto,
 * NodeProto, TensorProto, ValueInfoProto); the format is documented at onnx.ai.
 */

class Writer {
  private parts: Uint8Array[] = [];
  length = 0;

  private push(b: Uint8Array): void {
    this.parts.push(b);
    this.length += b.length;
  }

  varint(v: number): void {
    const out: number[] = [];
    let n = v;
    while (n >= 0x80) {
      out.push((n % 0x80) | 0x80);
      n = Math.floor(n / 0x80);
    }
    out.push(n);
    this.push(Uint8Array.from(out));
  }

  key(field: number, wire: number): void {
    this.varint(field * 8 + wire);
  }

  int(field: number, v: number): void {
    this.key(field, 0);
    this.varint(v);
  }

  bytes(field: number, b: Uint8Array): void {
    this.key(field, 2);
    this.varint(b.length);
    this.push(b);
  }

  string(field: number, s: string): void {
    this.bytes(field, new TextEncoder().encode(s));
  }

  message(field: number, m: Writer): void {
    this.key(field, 2);
    this.varint(m.length);
    for (const p of m.parts) this.push(p);
  }

  finish(): Uint8Array {
    const out = new Uint8Array(this.length);
    let o = 0;
    for (const p of this.parts) {
      out.set(p, o);
      o += p.length;
    }
    return out;
  }
}

/** ONNX TensorProto element types used here. */
export const ONNX_TYPE = { float32: 1, uint8: 2, int8: 3, int32: 6 } as const;
export type OnnxType = keyof typeof ONNX_TYPE;

function valueInfo(name: string, type: OnnxType, dims: (number | string)[]): Writer {
  const shape = new Writer();
  for (const d of dims) {
    const dim = new Writer();
    if (typeof d === "number") dim.int(1, d);
    else dim.string(2, d);
    shape.message(1, dim);
  }
  const tensor = new Writer();
  tensor.int(1, ONNX_TYPE[type]);
  tensor.message(2, shape);
  const typeProto = new Writer();
  typeProto.message(1, tensor);
  const vi = new Writer();
  vi.string(1, name);
  vi.message(2, typeProto);
  return vi;
}

/** A typed array an initializer is written from. */
export type InitData = Float32Array | Uint8Array | Int8Array;

/** One graph input or output: its name, element type and shape (a string is a symbolic dim). */
export interface OnnxValue {
  name: string;
  type: OnnxType;
  dims: (number | string)[];
}

/** One initializer: a named constant tensor. */
export interface OnnxInit {
  name: string;
  type: OnnxType;
  dims: number[];
  data: InitData;
}

/**
 * A model of one node ``opType`` (in ``domain``: "" for the ONNX operators, "com.microsoft"
 * for onnxruntime's) reading ``inputs`` (graph inputs and initializers, in the node's order)
 * and writing ``outputs``, as ONNX bytes (IR version 8; ``opsets`` maps domains to versions).
 */
export function oneNodeModel(opType: string, domain: string, nodeInputs: string[], outputs: OnnxValue[],
                             inputs: OnnxValue[], inits: OnnxInit[],
                             opsets: Record<string, number>): Uint8Array {
  const node = new Writer();
  for (const i of nodeInputs) node.string(1, i);
  for (const o of outputs) node.string(2, o.name);
  node.string(3, opType.toLowerCase());
  node.string(4, opType);
  if (domain) node.string(7, domain);
  const graph = new Writer();
  graph.message(1, node);
  graph.string(2, "privbert_graph");
  for (const t of inits) {
    const n = t.dims.reduce((a, b) => a * b, 1);
    if (t.data.length !== n) throw new RangeError(`initializer ${t.name} must have ${n} values, got ${t.data.length}`);
    const init = new Writer();
    for (const d of t.dims) init.int(1, d);
    init.int(2, ONNX_TYPE[t.type]);
    init.string(8, t.name);
    const raw = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    init.bytes(9, t.data.BYTES_PER_ELEMENT === 4 ? littleEndian(raw) : raw);
    graph.message(5, init);
  }
  for (const i of inputs) graph.message(11, valueInfo(i.name, i.type, i.dims));
  for (const o of outputs) graph.message(12, valueInfo(o.name, o.type, o.dims));
  const model = new Writer();
  model.int(1, 8);
  model.string(2, "privbert-edge");
  model.message(7, graph);
  for (const [d, v] of Object.entries(opsets)) {
    const opset = new Writer();
    opset.string(1, d);
    opset.int(2, v);
    model.message(8, opset);
  }
  return model.finish();
}

/**
 * The model `S (m, n) = Y (m, k) @ B (k, n)`, `B` the row-major float32 ``b`` given here, as
 * ONNX bytes (opset 13, IR version 8). Inputs: "Y"; output: "S".
 */
export function matmulModel(b: Float32Array, k: number, n: number): Uint8Array {
  if (b.length !== k * n) throw new RangeError(`B must have ${k}×${n} values, got ${b.length}`);
  return oneNodeModel("MatMul", "", ["Y", "B"], [{ name: "S", type: "float32", dims: ["m", n] }],
    [{ name: "Y", type: "float32", dims: ["m", k] }],
    [{ name: "B", type: "float32", dims: [k, n], data: b }], { "": 13 });
}

/** ``raw`` (4-byte values) as little-endian bytes (ONNX raw_data is little-endian; so is every
 * engine that runs WebAssembly, but a big-endian host would need the swap). */
function littleEndian(raw: Uint8Array): Uint8Array {
  const probe = new Uint8Array(new Uint32Array([1]).buffer);
  if (probe[0] === 1) return raw;
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i += 4) {
    out[i] = raw[i + 3]!;
    out[i + 1] = raw[i + 2]!;
    out[i + 2] = raw[i + 1]!;
    out[i + 3] = raw[i]!;
  }
  return out;
}
