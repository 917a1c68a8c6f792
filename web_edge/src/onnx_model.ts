/**
 * A one-node ONNX model, written as protobuf bytes by hand: `S = Y @ B` with `B` a float32
 * initializer. onnxruntime-web runs it with its WebAssembly (SIMD) MatMul, which is what makes
 * the exact nearest-token search fast enough in a page (the table product is the cost).
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

const FLOAT = 1;

function valueInfo(name: string, dims: (number | string)[]): Writer {
  const shape = new Writer();
  for (const d of dims) {
    const dim = new Writer();
    if (typeof d === "number") dim.int(1, d);
    else dim.string(2, d);
    shape.message(1, dim);
  }
  const tensor = new Writer();
  tensor.int(1, FLOAT);
  tensor.message(2, shape);
  const type = new Writer();
  type.message(1, tensor);
  const vi = new Writer();
  vi.string(1, name);
  vi.message(2, type);
  return vi;
}

/**
 * The model `S (m, n) = Y (m, k) @ B (k, n)`, `B` the row-major float32 ``b`` given here, as
 * ONNX bytes (opset 13, IR version 8). Inputs: "Y"; output: "S".
 */
export function matmulModel(b: Float32Array, k: number, n: number): Uint8Array {
  if (b.length !== k * n) throw new RangeError(`B must have ${k}×${n} values, got ${b.length}`);
  const init = new Writer();
  init.int(1, k);
  init.int(1, n);
  init.int(2, FLOAT);
  init.string(8, "B");
  const raw = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  init.bytes(9, littleEndian(raw));
  const node = new Writer();
  node.string(1, "Y");
  node.string(1, "B");
  node.string(2, "S");
  node.string(3, "matmul");
  node.string(4, "MatMul");
  const graph = new Writer();
  graph.message(1, node);
  graph.string(2, "table_product");
  graph.message(5, init);
  graph.message(11, valueInfo("Y", ["m", k]));
  graph.message(12, valueInfo("S", ["m", n]));
  const opset = new Writer();
  opset.string(1, "");
  opset.int(2, 13);
  const model = new Writer();
  model.int(1, 8);
  model.string(2, "privbert-edge");
  model.message(7, graph);
  model.message(8, opset);
  return model.finish();
}

/** ``raw`` as little-endian bytes (ONNX raw_data is little-endian; so is every engine that runs
 * WebAssembly, but a big-endian host would need the swap). */
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
