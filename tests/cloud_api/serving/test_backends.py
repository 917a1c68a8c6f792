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
    from models.export.writers import export_classifier_onnx

    path = tmp_path_factory.mktemp("onnx") / "v"
    shutil.copytree(trained["a"], path)
    export_classifier_onnx(path)
    return path


def test_onnx_gives_the_torch_probabilities(onnx_version, records, tmp_path):
    settings = settings_for(ModelHome(tmp_path), backend="onnx", torch_threads=1)
    onnx = load_backend(onnx_version, settings)
    torch_ = load_backend(onnx_version, settings_for(ModelHome(tmp_path), backend="torch"))
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


# -- onnx-int8 --------------------------------------------------------------------------------
def test_int8_backend_and_its_fallback(onnx_version, records, tmp_path):
    """The export wrote the int8 file: served as onnx-int8, near the fp32 answers; without
    it, PRIVBERT_INT8_FALLBACK=fp32 serves classifier.onnx and =refuse does not load."""
    home = ModelHome(tmp_path)
    payloads = [r.payload for r in records[:8]]
    int8 = load_backend(onnx_version, settings_for(home, backend="onnx-int8", torch_threads=1))
    fp32 = load_backend(onnx_version, settings_for(home, backend="onnx", torch_threads=1))
    assert (int8.name, fp32.name) == ("onnx-int8", "onnx")
    assert int8.kernel["exact"] and int8.kernel["scheme"]["reduce_range"]
    # tolerance: 7-bit weights on the tiny model move probabilities by about 1e-3
    assert float(np.abs(int8.forward(payloads) - fp32.forward(payloads)).max()) <= 0.05
    bare = tmp_path / "bare"
    shutil.copytree(onnx_version, bare)
    (bare / "classifier.int8.onnx").unlink()
    assert load_backend(bare, settings_for(home, backend="onnx-int8")).name == "onnx"
    with pytest.raises(BackendError, match="has no classifier.int8.onnx.*INT8_FALLBACK=refuse"):
        load_backend(bare, settings_for(home, backend="onnx-int8", int8_fallback="refuse"))


def test_int8_file_with_8_bit_weights_loads_only_where_the_kernel_is_exact(onnx_version,
                                                                            tmp_path):
    """Which integer kernel runs is probed, not assumed: 8-bit s8 weights saturate MLAS's
    u8 x s8 kernel on x86 without VNNI, and such a file is then not served."""
    from models.export.onnx_classifier import int8_kernel_check
    from models.export.quantize import QuantScheme, quantize_classifier

    home = ModelHome(tmp_path)
    folder = tmp_path / "v8"
    shutil.copytree(onnx_version, folder)
    quantize_classifier(folder, QuantScheme(reduce_range=False))
    exact = int8_kernel_check("s8", 127)["exact"]
    refuse = settings_for(home, backend="onnx-int8", int8_fallback="refuse")
    if exact:
        assert load_backend(folder, refuse).kernel["weight_max"] == 127
    else:
        with pytest.raises(BackendError, match="saturates on its weights"):
            load_backend(folder, refuse)
        assert load_backend(folder, settings_for(home, backend="onnx-int8")).name == "onnx"


def test_auto_serves_the_fastest_file_a_version_has(onnx_version, trained, tmp_path):
    """PRIVBERT_BACKEND=auto (the default) on a CPU: the int8 file where there is one, else
    classifier.onnx, else the torch weights; an int8 file this CPU cannot compute exactly
    falls to fp32 (checked in the int8 tests below through the kernel probe)."""
    home = ModelHome(tmp_path)
    settings = settings_for(home, torch_threads=1)
    assert settings.backend == "auto" and not settings.wants_gpu()
    assert load_backend(onnx_version, settings).name == "onnx-int8"
    fp32_only = tmp_path / "fp32"
    shutil.copytree(onnx_version, fp32_only)
    (fp32_only / "classifier.int8.onnx").unlink()
    assert load_backend(fp32_only, settings).name == "onnx"
    assert isinstance(load_backend(trained["a"], settings), TorchBackend)


@pytest.fixture(scope="module")
def contextual_version(tmp_path_factory):
    """A tiny dchi-text version reading a contextual denoiser (models.attacks.denoiser), exported to
    ONNX (the denoiser inside the graph), and records for it."""
    import torch

    from models.attacks.denoiser import new_denoiser
    from models.export.writers import export_classifier_onnx
    from models.nets.backbone import load_bert
    from models.nets.classifiers import build_classifier
    from models.training.posterior import build_posterior
    from models.versions.model_version import save_model_version
    from shared.bundle import EdgeBundle
    from tests.conftest import make_full_tiny_bert
    from tests.models.conftest import sentiment_texts, token_records

    tmp = tmp_path_factory.mktemp("contextual")
    bert_dir = make_full_tiny_bert(tmp / "bert")
    b = EdgeBundle.from_model(bert_dir)
    texts, _, labels = sentiment_texts(16, seed=2)
    table = build_posterior(b, "dchi-text", 4.0, texts, rng=np.random.default_rng(0))
    den = new_denoiser(table, b, layers=1, candidates=12, base=bert_dir)
    with torch.no_grad():
        den.out.weight.normal_(0, 0.3)  # reads the context
    model = build_classifier("dchi-text", 2, bert=load_bert(bert_dir), denoiser=den)
    cfg = {"kind": "tokens", "mechanism": "dchi-text", "params": {"eta": 4.0},
           "bundle_id": b.bundle_id, "special_ids": b.special_ids, "labels": ["neg", "pos"],
           "max_length": 32}
    path = save_model_version(tmp / "v1", model, cfg, {}, {})
    export_classifier_onnx(path, int8=False)
    return path, token_records(b, "dchi-text", texts, labels, eta=4.0)


def test_contextual_posterior_inside_the_onnx_graph(contextual_version, tmp_path):
    """The onnx backend gives the torch backend's probabilities for a version that reads a
    denoiser; without its denoiser.safetensors neither backend loads the version."""
    path, records = contextual_version
    onnx = load_backend(path, settings_for(ModelHome(tmp_path), backend="onnx",
                                           torch_threads=1))
    torch_ = load_backend(path, settings_for(ModelHome(tmp_path), backend="torch"))
    payloads = [r.payload for r in records]
    assert float(np.abs(onnx.forward(payloads) - torch_.forward(payloads)).max()) <= TOLERANCE
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    (broken / "denoiser.safetensors").unlink()
    for backend in ("onnx", "torch"):
        with pytest.raises(BackendError, match="no denoiser.safetensors: it is incomplete"):
            load_backend(broken, settings_for(ModelHome(tmp_path), backend=backend))
