"""Exports: the bundle's encoder.onnx takes the inputs the edge gives it and matches torch; classifier.onnx
matches the torch model for every kind of classifier."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import torch

from models.export.onnx_classifier import OnnxClassifier
from models.export.writers import (
    ENCODER_INPUTS,
    ENCODER_OUTPUT,
    SentenceEncoder,
    encoder_inputs,
    export_bundle,
    export_classifier_onnx,
)
from models.nets.backbone import load_bert
from models.training.experiment import train_from_records
from models.training.finetune import TrainConfig
from models.versions.model_version import load_model
from models.versions.version_folder import ONNX_FILE, read_config
from shared.bundle import EdgeBundle
from tests.models.conftest import sentiment_texts, token_records, vector_records

SENTENCES = ["the movie was good", "a very very dull plot and a bad actor", "fun", "love it !"]


def test_encoder_follows_contract(tiny_encoder_bundle, tiny_bert_dir):
    b = tiny_encoder_bundle
    assert b.encoder_onnx is not None
    meta = b.meta["encoder"]
    assert meta["file"] == "encoder.onnx" and meta["pooling"] == "mean"
    assert meta["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert meta["output"] == "sentence_embedding" and meta["output_dim"] == 16
    assert meta["max_length"] == 64 and isinstance(meta["opset"], int)
    model = onnx.load_from_string(b.encoder_onnx)
    inputs = {i.name: i for i in model.graph.input}
    assert list(inputs) == list(ENCODER_INPUTS)
    for i in inputs.values():
        t = i.type.tensor_type
        assert t.elem_type == onnx.TensorProto.INT64
        dims = t.shape.dim
        assert len(dims) == 2 and all(d.dim_param and not d.dim_value for d in dims)
    (out,) = model.graph.output
    assert out.name == ENCODER_OUTPUT
    assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    odims = out.type.tensor_type.shape.dim
    assert odims[0].dim_param and odims[1].dim_value == 16
    # the encoder is part of the bundle's identity
    assert b.bundle_id != EdgeBundle.from_model(tiny_bert_dir).bundle_id


@pytest.mark.parametrize("batch", [[0], [1, 2], [0, 1, 2, 3]])
def test_encoder_matches_torch_any_batch_and_length(tiny_encoder_bundle, tiny_bert_dir, batch):
    import onnxruntime as ort

    sess = ort.InferenceSession(tiny_encoder_bundle.encoder_onnx,
                                providers=["CPUExecutionProvider"])
    enc = SentenceEncoder(load_bert(tiny_bert_dir).eval(), "mean").eval()
    texts = [SENTENCES[i] for i in batch]
    feed = encoder_inputs(tiny_encoder_bundle, texts)
    got = sess.run([ENCODER_OUTPUT], feed)[0]
    assert got.dtype == np.float32 and got.shape == (len(texts), 16)
    with torch.no_grad():  # each sentence alone, unpadded
        want = np.stack([enc(**{k: torch.from_numpy(v) for k, v in
                                encoder_inputs(tiny_encoder_bundle, [t]).items()}).numpy()[0]
                         for t in texts])
    assert np.abs(got - want).max() <= 1e-4


def test_edge_encoder_reads_the_export(tiny_encoder_bundle, tiny_bert_dir):
    """The consumer's side of encoder.onnx: edge_agent's SentenceEncoder on the bundle."""
    from edge_agent.privatize.encoder import SentenceEncoder as EdgeEncoder

    edge = EdgeEncoder.from_bundle(tiny_encoder_bundle)
    feed = encoder_inputs(tiny_encoder_bundle, SENTENCES)
    seqs = [row[m == 1] for row, m in zip(feed["input_ids"], feed["attention_mask"],
                                          strict=True)]
    got = edge.encode(seqs, [np.zeros_like(s) for s in seqs])
    enc = SentenceEncoder(load_bert(tiny_bert_dir).eval(), "mean").eval()
    with torch.no_grad():
        want = enc(**{k: torch.from_numpy(v) for k, v in feed.items()}).numpy()
    assert np.abs(got - want).max() <= 1e-4


def test_cls_pooling_export(tiny_bert_dir, tmp_path):
    b = export_bundle(tmp_path / "cls", tiny_bert_dir, pooling="cls")
    assert b.meta["encoder"]["pooling"] == "cls"
    assert b.meta["encoder"]["checked_max_abs_diff"] <= 1e-4
    with pytest.raises(ValueError, match="pooling"):
        SentenceEncoder(load_bert(tiny_bert_dir), "max")


@pytest.mark.parametrize("kind", ["dchi-text", "dchi-embedding", "laplace"])
def test_classifier_onnx_matches_torch(kind, tiny_bert_dir, tiny_bert_bundle, tmp_path,
                                       caplog):
    texts, pairs, labels = sentiment_texts(16, pairs=True)
    if kind == "laplace":
        recs = vector_records(tiny_bert_bundle.bundle_id, kind, 16)
    else:  # sentence pairs exercise token types in the graph
        recs = token_records(tiny_bert_bundle, kind, texts, labels, pairs=pairs, eta=50.0)
    res = train_from_records(recs, tmp_path / kind, bundle=tiny_bert_bundle,
                             base=None if kind == "laplace" else tiny_bert_dir,
                             cfg=TrainConfig(epochs=1, lr=1e-3, batch_size=8, progress=False,
                                             hidden=(32,), seed=0))
    with caplog.at_level(logging.INFO):
        path = export_classifier_onnx(res.model_dir)  # and classifier.int8.onnx
    assert path.name == ONNX_FILE and path.is_file()
    # onnxruntime.quantization logs a line per tensor on the root logger: kept out of the
    # logs (a retraining job's log tail), its warnings not
    assert not [r for r in caplog.records
                if "onnxruntime" in r.pathname and r.levelno < logging.WARNING]
    cfg = read_config(res.model_dir)
    assert cfg["onnx"]["checked_max_abs_diff"] <= 1e-4
    payloads = [r.payload for r in recs]
    got = OnnxClassifier(res.model_dir).predict_proba(payloads)
    want = load_model(res.model_dir).predict_proba(payloads)
    assert got.shape == want.shape == (16, 2)
    assert np.abs(got - want).max() <= 1e-4
    one = OnnxClassifier(res.model_dir, threads=1)  # a thread count: same answers
    opts = one.session.get_session_options()
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)
    np.testing.assert_allclose(one.predict_proba(payloads), got, atol=1e-6)
    with pytest.raises(ValueError, match="threads"):
        OnnxClassifier(res.model_dir, threads=0)


def test_onnx_classifier_needs_export(tiny_bert_bundle, tmp_path):
    recs = vector_records(tiny_bert_bundle.bundle_id, "laplace", 8)
    res = train_from_records(recs, tmp_path / "m", bundle=tiny_bert_bundle,
                             cfg=TrainConfig(epochs=1, progress=False, hidden=(8,)))
    with pytest.raises(ValueError, match="classifier.onnx"):
        OnnxClassifier(res.model_dir)
