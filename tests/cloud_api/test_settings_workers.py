"""The inference replicas a server runs per version when PRIVBERT_INFERENCE_WORKERS is
unset: one per PRIVBERT_TORCH_THREADS of the usable cores for the onnx backends, one for
torch."""

from __future__ import annotations

import os

import pytest

from cloud_api.settings import Settings

CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("env", "expected"), [
    ({"backend": "onnx-int8", "torch_threads": 1}, CORES),
    ({"backend": "onnx", "torch_threads": 1}, CORES),
    ({"backend": "onnx", "torch_threads": CORES + 1}, 1),  # never 0
    ({"backend": "onnx-int8"}, 1),  # onnxruntime spreads one forward over every core
    ({"backend": "torch", "torch_threads": 1}, 1),
    ({"backend": "onnx-int8", "torch_threads": 1, "inference_workers": 3}, 3),
])
def test_default_inference_workers(env, expected, tmp_path):
    assert Settings(home=tmp_path, **env).inference_replicas() == expected


def test_inference_workers_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PRIVBERT_INFERENCE_WORKERS", "5")
    monkeypatch.setenv("PRIVBERT_BACKEND", "torch")
    assert Settings(home=tmp_path).inference_replicas() == 5
    monkeypatch.setenv("PRIVBERT_INFERENCE_WORKERS", "0")
    with pytest.raises(ValueError, match="inference_workers"):
        Settings(home=tmp_path)
