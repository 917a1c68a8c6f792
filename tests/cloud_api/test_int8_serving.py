"""The onnx-int8 backend end to end: a real `cloud-api serve` with PRIVBERT_BACKEND=onnx-int8
and PRIVBERT_INT8_FALLBACK=refuse on a home of three copies of the session's bootstrapped
``text`` v1 (bootstrap exported ``classifier.onnx`` and quantized ``classifier.int8.onnx``):

* ``text``: served by its int8 file; the answers are onnxruntime's on that file, and close
  to the fp32 file's;
* ``noint8``: no int8 file: refused at load, predictions 503 saying what is missing;
* ``stale``: its ``classifier.onnx`` was exported again after the int8 file was made (so
  the int8 file belongs to another ONNX file): refused at load, whatever the fallback.

Also: bad values of the backend settings stop `cloud-api serve` with one line naming the
variable, and `cloud-api models register` builds the int8 file of a folder that lacks one.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time

import httpx
import numpy as np
import pytest

from tests.cloud_api.conftest import TIMEOUT, ServerProcess, new_keys, payloads_for

TEXTS = ["a good fun movie", "an awful dull plot", "the best film of the year , great"]
# int8 against fp32 on the tiny model: probabilities differ by a few thousandths (7-bit
# weights, 8-bit activations); 0.05 would still catch a file of another model
FP32_TOLERANCE = 0.05


def _copy(src, home, model_id: str, edit=None) -> None:
    tmp = home.root.parent / f"src-{model_id}"
    shutil.copytree(src, tmp)
    if edit is not None:
        edit(tmp)
        (tmp / "manifest.json").unlink()  # changed on purpose: sealed anew by register
    home.promote(model_id, home.register(model_id, tmp, move=True))


def _reexport(folder) -> None:
    """classifier.onnx as a new export would leave it: another file, same graph."""
    import onnx

    model = onnx.load(str(folder / "classifier.onnx"))
    onnx.helper.set_model_props(model, {"exported": "again"})
    onnx.save(model, str(folder / "classifier.onnx"))


@pytest.fixture(scope="module")
def int8_server(tiny_home, tmp_path_factory):
    from cloud_api.home import ModelHome
    from cloud_api.serving.bundles import BundleStore
    from shared.bundle import EdgeBundle

    src = ModelHome(tiny_home.root).version_dir("text", tiny_home.promoted_at_start["text"])
    assert (src / "classifier.int8.onnx").is_file(), "bootstrap did not quantize"
    root = tmp_path_factory.mktemp("int8")
    home = ModelHome(root / "home").ensure()
    BundleStore(home).add(EdgeBundle.from_model(tiny_home.base))
    _copy(src, home, "text")
    _copy(src, home, "noint8", lambda d: (d / "classifier.int8.onnx").unlink())
    _copy(src, home, "stale", _reexport)
    srv = ServerProcess(home.root, root / "serve.log", new_keys(), env={
        "PRIVBERT_BACKEND": "onnx-int8", "PRIVBERT_INT8_FALLBACK": "refuse",
        "PRIVBERT_WORKER_IN_SERVE": "0"})
    srv.launch()
    # never ready (two models are refused, as they should be): wait until it answers, which
    # uvicorn does once every promoted version has loaded or failed
    deadline = time.monotonic() + TIMEOUT
    while True:
        assert srv.proc.poll() is None, srv.log_tail()
        assert time.monotonic() < deadline, srv.log_tail()
        try:
            if httpx.get(f"{srv.url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    yield srv, home
    srv.stop()


def _body(payloads) -> dict:
    return {"payloads": [json.loads(p.model_dump_json(exclude_none=True)) for p in payloads]}


def test_int8_version_is_served_by_its_int8_file(int8_server, tiny_bundle_of_home):
    from models.export.onnx_classifier import OnnxClassifier
    from models.training.data import collate_payloads

    srv, home = int8_server
    model = srv.model("text")
    assert model["backend"] == "onnx-int8"
    payloads = payloads_for(model, TEXTS, tiny_bundle_of_home)
    r = httpx.post(f"{srv.url}/v1/models/text/predict", headers=srv.headers(),
                   json=_body(payloads), timeout=30)
    assert r.status_code == 200, r.text
    labels = model["labels"]
    got = np.array([[p["scores"][lab] for lab in labels] for p in r.json()["predictions"]])

    def probs(int8: bool, group) -> np.ndarray:
        clf = OnnxClassifier(home.version_dir("text", "v1"), int8=int8)
        z = clf.logits(collate_payloads(group, clf.config, as_numpy=True)).astype(float)
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    # Dynamic quantization takes each activation's scale from the whole batch it runs in, so
    # an int8 answer moves a little (up to ~1e-3 here) with the batch the batcher cut: each
    # answer must be the int8 file's in one of the batches it can have been part of.
    for i in range(len(payloads)):
        groups = [g for k in range(1, len(payloads) + 1)
                  for g in itertools.combinations(range(len(payloads)), k) if i in g]
        assert min(np.abs(got[i] - probs(True, [payloads[j] for j in g])[g.index(i)]).max()
                   for g in groups) <= 1e-5
    assert np.abs(got - probs(False, payloads)).max() <= FP32_TOLERANCE


def test_versions_without_a_matching_int8_file_are_refused(int8_server, tiny_bundle_of_home):
    srv, _ = int8_server
    ready = httpx.get(f"{srv.url}/readyz", timeout=10)
    assert ready.status_code == 503
    problems = json.dumps(ready.json())
    assert "has no classifier.int8.onnx" in problems and "INT8_FALLBACK=refuse" in problems
    assert "quantized from another classifier.onnx" in problems
    model = srv.model("text")
    payloads = payloads_for(model, TEXTS[:1], tiny_bundle_of_home)
    for model_id, says in (("noint8", "has no classifier.int8.onnx"),
                           ("stale", "quantized from another classifier.onnx")):
        r = httpx.post(f"{srv.url}/v1/models/{model_id}/predict", headers=srv.headers(),
                       json=_body(payloads), timeout=30)
        assert r.status_code == 503, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"] == "urn:privbert:problem:unavailable"
        assert says in r.json()["detail"]
    assert "Traceback" not in srv.log.read_text()


@pytest.mark.parametrize("variable, value, allowed", [
    ("PRIVBERT_BACKEND", "int8", "'auto', 'torch', 'onnx' or 'onnx-int8'"),
    ("PRIVBERT_INT8_FALLBACK", "maybe", "'fp32' or 'refuse'"),
])
def test_bad_backend_settings_stop_serve_with_one_line(tmp_path, monkeypatch, capsys,
                                                      variable, value, allowed):
    from cloud_api.cli import main

    for k, v in {variable: value, "PRIVBERT_API_KEYS": "a", "PRIVBERT_ADMIN_KEYS": "b"}.items():
        monkeypatch.setenv(k, v)
    assert main(["serve", "--home", str(tmp_path), "--port", "0"]) == 2  # before uvicorn
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert variable in lines[0] and allowed in lines[0] and repr(value) in lines[0]


def test_register_builds_the_int8_file(tiny_home, tmp_path, capsys):
    from cloud_api.cli import main
    from cloud_api.home import ModelHome
    from models.export.quantize import has_current_int8

    src = ModelHome(tiny_home.root).version_dir("text", tiny_home.promoted_at_start["text"])
    folder = tmp_path / "trained"
    shutil.copytree(src, folder)
    (folder / "classifier.int8.onnx").unlink()
    assert main(["models", "register", str(folder), "--model-id", "m",
                 "--home", str(tmp_path / "home")]) == 0
    assert "quantized classifier.onnx into classifier.int8.onnx" in capsys.readouterr().out
    assert not (folder / "classifier.int8.onnx").exists()  # the user's folder is untouched
    version = ModelHome(tmp_path / "home").version_dir("m", "v1")
    assert has_current_int8(version)
    assert json.loads((version / "config.json").read_text())["onnx_int8"]["scheme"] == {
        "embeddings": True, "method": "dynamic", "per_channel": True, "reduce_range": True,
        "weights": "s8"}
