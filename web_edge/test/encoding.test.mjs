// The wire formats: Python's canonical JSON (bundle_id), orjson's float format, base64,
// float16 rounding, and a payload built byte for byte as the Python edge builds it.
import assert from "node:assert/strict";
import { test } from "node:test";

import { base64, f16Bits, floatBytes, fromBase64, int32Bytes, orjsonFloat, recordLine, payloadJson } from "../dist/service/payload.js";
import { parseRaw, pyDumps, pyFloat, PyFloat } from "../dist/format/pyjson.js";

test("pyDumps writes what json.dumps(sort_keys=True, separators=(',', ':')) writes", () => {
  // python -c 'import json; print(json.dumps({"b": [1, 2.5, None, True], "a": "é\\n\\u0007😀", "c": {"z": 1e-05, "y": 65.0}}, sort_keys=True, separators=(",", ":")))'
  const want = '{"a":"\\u00e9\\n\\u0007\\ud83d\\ude00","b":[1,2.5,null,true],"c":{"y":65.0,"z":1e-05}}';
  assert.equal(pyDumps({ b: [1, 2.5, null, true], a: "é\n\u0007😀", c: { z: new PyFloat(1e-5), y: new PyFloat(65) } }), want);
  // numbers read from a document keep their literal text
  assert.equal(pyDumps(parseRaw('{ "y": 65.0, "x": [1e-05, 3] }')), '{"x":[1e-05,3],"y":65.0}');
  assert.throws(() => parseRaw("{"), SyntaxError);
  assert.throws(() => parseRaw('{"a": 1} x'), SyntaxError);
});

test("pyFloat is Python's repr", () => {
  const cases = [[65, "65.0"], [0.1, "0.1"], [1e-5, "1e-05"], [1e16, "1e+16"], [1e15, "1000000000000000.0"],
    [1.5e-7, "1.5e-07"], [123.456, "123.456"], [-2.5, "-2.5"], [0.0001, "0.0001"]];
  for (const [x, s] of cases) assert.equal(pyFloat(x), s, String(x));
});

test("orjsonFloat is orjson's format", () => {
  // python -c 'import orjson; print([orjson.dumps(v) for v in (65.0, 1e-07, 1e-06, 1e-05, 1e+16, 9.99e+15, 0.1)])'
  const cases = [[65, "65.0"], [1e-7, "1e-7"], [1e-6, "1e-6"], [1e-5, "0.00001"], [1e16, "1e+16"],
    [9.99e15, "9990000000000000.0"], [0.1, "0.1"], [5e-324, "5e-324"]];
  for (const [x, s] of cases) assert.equal(orjsonFloat(x), s, String(x));
  assert.throws(() => orjsonFloat(Infinity));
});

test("base64 round trip, canonical padding", () => {
  for (const n of [0, 1, 2, 3, 4, 5, 100]) {
    const b = Uint8Array.from({ length: n }, (_, i) => (i * 37 + 11) & 255);
    const s = base64(b);
    assert.equal(s, Buffer.from(b).toString("base64"));
    assert.deepEqual(fromBase64(s), b);
  }
  assert.throws(() => fromBase64("abc"));
});

test("float16 rounds to nearest even and refuses overflow", () => {
  assert.equal(f16Bits(1), 0x3c00);
  assert.equal(f16Bits(65504), 0x7bff);
  assert.equal(f16Bits(-2), 0xc000);
  assert.equal(f16Bits(1 + 2 ** -11), 0x3c00); // tie to even
  assert.equal(f16Bits(1 + 3 * 2 ** -11), 0x3c02); // tie to even (up)
  assert.equal(f16Bits(2 ** -24), 0x0001); // smallest subnormal
  assert.throws(() => floatBytes(Float64Array.of(70000), "float16"), /NaN or Inf \(after the cast to float16\)/);
});

test("a dchi-text payload is the Python edge's bytes", () => {
  // python -c "import numpy as np, orjson; from shared.payload import make_payloads;
  //   p = make_payloads('dchi-text', {'eta': 65.0}, 'f'*64, np.array([1,2,3,4,5]), [3,2], [None,[1,1]]);
  //   print([orjson.dumps(x.model_dump(exclude_none=True)) for x in p])"
  const id = "f".repeat(64);
  assert.equal(payloadJson("dchi-text", { eta: 65 }, id, { dtype: "int32", shape: [3], bytes: int32Bytes([1, 2, 3]) }, null),
    `{"version":1,"bundle_id":"${id}","mechanism":"dchi-text","params":{"eta":65.0},"token_ids":{"dtype":"int32","shape":[3],"data":"AQAAAAIAAAADAAAA"}}`);
  assert.equal(payloadJson("dchi-text", { eta: 65 }, id, { dtype: "int32", shape: [2], bytes: int32Bytes([4, 5]) }, [1, 1]),
    `{"version":1,"bundle_id":"${id}","segments":[1,1],"mechanism":"dchi-text","params":{"eta":65.0},"token_ids":{"dtype":"int32","shape":[2],"data":"BAAAAAUAAAA="}}`);
  assert.equal(recordLine("{}", null), '{"payload":{}}\n');
  assert.equal(recordLine("{}", "pos"), '{"payload":{},"label":"pos"}\n');
});
