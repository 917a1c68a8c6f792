"""laplace (DPNR) and ome through the bundle's ONNX sentence encoder in the web edge, against
`edge-agent` with the same seed: the same draws (word dropout, Laplace noise, randomized
response), so the same payloads up to the encoder's float32 arithmetic (onnxruntime-web's
WebAssembly kernels against onnxruntime's native ones); valid in shared.payload, costed as
shared.ledger costs them, and refused under the privacy floor with the Python edge's message."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from tests.web_edge.conftest import js_edge, py_edge

LINES = ["the movie was good", "a bad plot , very dull", "the story is fun and the actor is great",
         "it was not funny but the film is very good and this plot is great fun"]


def _values(payload: dict) -> np.ndarray:
    field = "vector" if "vector" in payload else "bits"
    raw = base64.b64decode(payload[field]["data"])
    if field == "vector":
        return np.frombuffer(raw, dtype="<f4").astype(np.float64)
    return np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=payload[field]["shape"][0])


@pytest.mark.parametrize("args", [
    ["--mechanism", "laplace", "--epsilon", "20", "--calibration", "coordinate",
     "--word-dropout", "0.3"],
    ["--mechanism", "ome", "--epsilon", "500", "--lam", "30"],
])
def test_seeded_vector_payloads_match_edge_agent(tiny_enc_dir, tmp_path, args):
    from shared.arrays import Limits
    from shared.bundle import EdgeBundle
    from shared.ledger import payload_cost
    from shared.payload import parse_record

    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(LINES) + "\n")
    base = ["privatize", str(inp), *args, "--bundle", str(tiny_enc_dir), "--seed", "4"]
    js = js_edge(*base, tmp=tmp_path)
    py = py_edge(*base, "--no-progress", tmp=tmp_path)
    assert js.returncode == py.returncode == 0, js.stderr + py.stderr
    a = [json.loads(x)["payload"] for x in js.stdout.splitlines()]
    b = [json.loads(x)["payload"] for x in py.stdout.splitlines()]
    assert len(a) == len(b) == len(LINES)
    field = "bits" if "ome" in args else "vector"
    for x, y in zip(a, b, strict=True):
        assert {k: v for k, v in x.items() if k != field} == \
            {k: v for k, v in y.items() if k != field}
        assert x[field]["shape"] == y[field]["shape"] and x[field]["dtype"] == y[field]["dtype"]
        vx, vy = _values(x), _values(y)
        if field == "vector":  # same noise; the encoders differ in float32 rounding only
            assert np.abs(vx - vy).max() < 1e-5
        else:  # bits: a z-score on a fraction-step boundary could flip one, rarely
            assert (vx != vy).mean() <= 0.01
    bundle = EdgeBundle.load(tiny_enc_dir)
    limits = Limits.for_bundle(bundle)
    records = [parse_record(line, limits) for line in js.stdout.splitlines()]
    status = json.loads(js_edge("budget", tmp=tmp_path).stdout)
    fam = "laplace" if "laplace" in args else "randomized-response"
    want = sum(payload_cost(r.payload).epsilon for r in records)
    assert status["families"][fam]["epsilon"] == pytest.approx(want, rel=1e-12)
    line = next(x for x in js.stderr.splitlines() if " records, " in x)
    pyline = next(x for x in py.stderr.splitlines() if " records, " in x)
    assert line.split("truncated; ")[1].split("; ledger")[0] == \
        pyline.split("truncated; ")[1].split("; ledger")[0]  # the guarantee line


@pytest.mark.parametrize("args", [
    ["--mechanism", "laplace", "--epsilon", "1e12"],
    ["--mechanism", "ome", "--epsilon", "1", "--lam", "1e9"],
])
def test_vector_parameters_under_the_floor_get_edge_agents_refusal(tiny_enc_dir, tmp_path, args):
    inp = tmp_path / "in.txt"
    inp.write_text("the movie was good\n")
    base = ["privatize", str(inp), *args, "--bundle", str(tiny_enc_dir)]
    js = js_edge(*base, tmp=tmp_path)
    py = py_edge(*base, "--no-progress", tmp=tmp_path)
    assert js.returncode == py.returncode == 2, js.stderr + py.stderr
    assert js.stderr == py.stderr.replace("edge-agent", "privbert-edge")
    assert js.stdout == ""
