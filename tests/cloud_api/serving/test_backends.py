"""Backends: the onnxruntime backend gives the torch backend's probabilities; a version
without classifier.onnx says so when loading."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from cloud_api.home import ModelHome
from cloud_api.serving.backends import BackendError, OnnxBackend, TorchBackend, load_backend
from tests.cloud_api.serving.conftest import settings_for

TOLERANCE = 1e-4  # max |p_onnx - p_torch|; the export itself is checked to 1e-4 on logits


@pytest.fixture(scope="module")
def onnx_version(trained, tmp_path_factory):
    from models.export import export_classifier_onnx

    path = tmp_path_factory.mktemp("onnx") / "v"
    shutil.copytree(trained["a"], path)
    export_classifier_onnx(path)
    return path


def test_onnx_gives_the_torch_probabilities(onnx_version, records, tmp_path):
    settings = settings_for(ModelHome(tmp_path), backend="onnx", torch_threads=1)
    onnx = load_backend(onnx_version, settings)
    torch_ = load_backend(onnx_version, settings_for(ModelHome(tmp_path)))
    assert isinstance(onnx, OnnxBackend) and isinstance(torch_, TorchBackend)
    payloads = [r.payload for r in records]  # 3..7 tokens: padded batches
    got, want = onnx.forward(payloads), torch_.forward(payloads)
    assert got.dtype == np.float32 and got.shape == (len(payloads), 2)
    assert float(np.abs(got - want).max()) <= TOLERANCE
    np.testing.assert_allclose(got.sum(axis=1), 1.0, atol=1e-6)


def test_onnx_threads_set_on_the_one_session_built(onnx_version, records, tmp_path,
                                                   monkeypatch):
    """PRIVBERT_TORCH_THREADS reaches the one onnxruntime session built at load (intra-op
    n, inter-op 1); the answers are those of a default session."""
    import onnxruntime as ort

    real, built = ort.InferenceSession, []

    def counting(*args, **kw):
        built.append(args)
        return real(*args, **kw)

    payloads = [r.payload for r in records]
    default = load_backend(onnx_version, settings_for(ModelHome(tmp_path), backend="onnx"))
    monkeypatch.setattr(ort, "InferenceSession", counting)
    onnx = load_backend(onnx_version, settings_for(ModelHome(tmp_path), backend="onnx",
                                                   torch_threads=2))
    assert len(built) == 1, built
    opts = onnx.classifier.session.get_session_options()
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (2, 1)
    assert default.classifier.session.get_session_options().intra_op_num_threads == 0
    np.testing.assert_allclose(onnx.forward(payloads), default.forward(payloads), atol=1e-6)


def test_onnx_backend_without_an_export_says_so(trained, tmp_path):
    with pytest.raises(BackendError, match="no classifier.onnx for the onnx backend"):
        load_backend(trained["a"], settings_for(ModelHome(tmp_path), backend="onnx"))


def test_torch_backend_pads_without_changing_answers(trained, records, tmp_path):
    backend = load_backend(trained["a"], settings_for(ModelHome(tmp_path)))
    payloads = [r.payload for r in records[:12]]
    alone = np.concatenate([backend.forward([p]) for p in payloads])
    np.testing.assert_allclose(backend.forward(payloads), alone, atol=1e-5)


def test_a_folder_that_is_not_a_model_is_a_backend_error(tmp_path):
    (tmp_path / "v1").mkdir()
    with pytest.raises(BackendError, match="not a model folder"):
        load_backend(tmp_path / "v1", settings_for(ModelHome(tmp_path)))
