"""The serve image has no torch: `cloud-api serve` on the onnx backend must never import it.

A folder put first on the subprocess's PYTHONPATH holds ``torch`` and ``transformers``
packages whose import writes a marker file and raises ImportError, as in an image without
them. The modules of the onnx serving path import without touching them, and a real
`cloud-api serve` (PRIVBERT_BACKEND=onnx, no worker thread) loads the session's bootstrapped
``text`` v1 (exported to classifier.onnx by bootstrap), answers /readyz, predictions equal to
onnxruntime's on the same batch, a records upload and a retraining request (enqueued only),
and never tried to import either package.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from tests.cloud_api.conftest import (
    ServerProcess,
    cli_env,
    new_keys,
    onnx_home,
    payloads_for,
)
from tests.conftest import REPO

BLOCKED = ("torch", "transformers")
SERVING_MODULES = ("cloud_api.cli", "cloud_api.app", "cloud_api.serving.backends",
                   "cloud_api.serving.checks", "cloud_api.serving.hot_swap",
                   "cloud_api.serving.loading", "cloud_api.serving.payload_queue",
                   "models.training.data", "models.export.onnx_classifier", "models.versions.version_folder")


@pytest.fixture
def no_torch(tmp_path):
    """(PYTHONPATH prefix, marker folder): importing a blocked package writes
    ``marker/<name>`` and raises ImportError."""
    blocker, marker = tmp_path / "blocker", tmp_path / "imported"
    marker.mkdir()
    for name in BLOCKED:
        (blocker / name).mkdir(parents=True)
        (blocker / name / "__init__.py").write_text(
            f"open({str(marker / name)!r}, 'w').close()\n"
            f"raise ImportError('{name} is not installed in the serve image (test blocker)')\n")
    return blocker, marker


def test_onnx_serving_modules_import_without_torch(no_torch):
    blocker, marker = no_torch
    code = ("import importlib, sys\n"
            f"for m in {SERVING_MODULES!r}: importlib.import_module(m)\n"
            f"print(sorted(set({BLOCKED!r}) & set(sys.modules)))\n")
    env = cli_env({"PYTHONPATH": f"{blocker}:{REPO}"})
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"
    assert not list(marker.iterdir())


def test_serve_on_onnx_never_imports_torch(tiny_home, no_torch, tmp_path):
    from models.export.onnx_classifier import OnnxClassifier
    from models.training.data import collate_payloads

    blocker, marker = no_torch
    home, bundle = onnx_home(tiny_home, tmp_path / "home")
    srv = ServerProcess(home.root, tmp_path / "serve.log", new_keys(), env={
        "PYTHONPATH": f"{blocker}:{REPO}", "PRIVBERT_BACKEND": "onnx",
        "PRIVBERT_WORKER_IN_SERVE": "0", "PRIVBERT_MIN_RECORDS_PER_LABEL": "1"})
    srv.start()
    try:
        model = srv.model("text")
        assert model["version"] == "v1"
        payloads = payloads_for(model, ["a good fun movie", "an awful dull plot"], bundle)
        body = {"payloads": [json.loads(p.model_dump_json(exclude_none=True))
                             for p in payloads]}
        r = httpx.post(f"{srv.url}/v1/models/text/predict", headers=srv.headers(), json=body,
                       timeout=30)
        assert r.status_code == 200, r.text
        labels = model["labels"]  # the order of the classifier's outputs
        got = np.array([[p["scores"][lab] for lab in labels] for p in r.json()["predictions"]])
        clf = OnnxClassifier(home.version_dir("text", "v1"))
        z = clf.logits(collate_payloads(payloads, clf.config, as_numpy=True)).astype(np.float64)
        want = np.exp(z - z.max(axis=1, keepdims=True))
        want /= want.sum(axis=1, keepdims=True)
        assert np.abs(got - want).max() <= 1e-5
        records = {"task": "text", "records": [
            {"payload": json.loads(p.model_dump_json(exclude_none=True)), "label": labels[i]}
            for i, p in enumerate(payloads)]}
        r = httpx.post(f"{srv.url}/v1/records", headers=srv.headers(), json=records,
                       timeout=30)
        assert r.status_code == 201, r.text
        r = httpx.post(f"{srv.url}/admin/retrain", headers=srv.headers(srv.admin_key),
                       json={"task": "text", "model_id": "text", "epochs": 1}, timeout=30)
        assert r.status_code == 202, r.text  # enqueued; the train image's worker runs it
        job = httpx.get(f"{srv.url}/admin/jobs/{r.json()['job_id']}",
                        headers=srv.headers(srv.admin_key), timeout=30).json()
        assert job["state"] == "queued"  # no worker thread in this server
    finally:
        srv.stop()
    assert not list(marker.iterdir()), "the onnx server tried to import " + ", ".join(
        p.name for p in marker.iterdir())
    assert "Traceback" not in srv.log.read_text()
