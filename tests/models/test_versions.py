"""Model version folders: complete, atomic, loadable, strict about payloads, and free of raw
text."""

from __future__ import annotations

import numpy as np
import pytest

from models.training.data import dataset_from_records
from models.training.experiment import train_from_records, train_from_tsv
from models.training.finetune import TrainConfig
from models.versions.manifest import MANIFEST_FILE, verify_folder
from models.versions.model_version import load_model, save_model_version
from models.versions.version_folder import (
    CONFIG_FILE,
    DATA_FILE,
    METRICS_FILE,
    WEIGHTS_FILE,
    is_model_dir,
    read_config,
)
from shared.payload import make_payload
from tests.models.conftest import sentiment_texts, token_records, vector_records, write_tsv

FAST = TrainConfig(epochs=1, lr=1e-3, batch_size=8, progress=False, seed=0)


@pytest.fixture(scope="module")
def trained(tiny_bert_dir, tiny_bert_bundle, tmp_path_factory):
    texts, _, labels = sentiment_texts(24)
    recs = token_records(tiny_bert_bundle, "dchi-text", texts, labels, eta=50.0)
    out = tmp_path_factory.mktemp("reg") / "v1"
    res = train_from_records(recs, out, bundle=tiny_bert_bundle, dev_records=recs[:8],
                             base=tiny_bert_dir, cfg=FAST)
    return res, recs


def test_folder_is_complete_and_loads(trained, tiny_bert_bundle):
    res, recs = trained
    names = {p.name for p in res.model_dir.iterdir()}
    assert names == {CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE, DATA_FILE, MANIFEST_FILE}
    assert verify_folder(res.model_dir).sealed  # sealed when made (issue 42)
    cfg = read_config(res.model_dir)
    assert cfg["mechanism"] == "dchi-text" and cfg["params"] == {"eta": 50.0}
    assert cfg["bundle_id"] == tiny_bert_bundle.bundle_id
    assert cfg["labels"] == ["neg", "pos"] and cfg["max_length"] == 8 * 16
    assert cfg["guarantee"]["mechanism"] == "dchi-text"
    assert cfg["guarantee"]["worst_case"]["epsilon"] > 0
    data = __import__("json").loads((res.model_dir / DATA_FILE).read_text())
    assert data["train_fingerprint"] == dataset_from_records(recs, None).fingerprint
    assert data["dev_examples"] == 8 and res.metrics["best_epoch"] == 1
    assert is_model_dir(res.model_dir)
    mv = load_model(res.model_dir)
    probs = mv.predict_proba([r.payload for r in recs[:5]])
    assert probs.shape == (5, 2) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-6)
    # the same weights in memory and on disk give the same predictions
    again = load_model(res.model_dir).predict_proba([r.payload for r in recs[:5]])
    assert np.array_equal(probs, again)


def test_check_payload_refuses_other_bundle_params_and_mechanism(trained, tiny_bert_bundle):
    res, recs = trained
    mv = load_model(res.model_dir)
    ids = recs[0].payload.data_array()
    bad = [
        (make_payload("dchi-text", {"eta": 50.0}, "0" * 64, ids), "bundle"),
        (make_payload("dchi-text", {"eta": 60.0}, tiny_bert_bundle.bundle_id, ids), "parameters"),
        (make_payload("none", {}, tiny_bert_bundle.bundle_id, ids), "mechanism"),
    ]
    for payload, word in bad:
        with pytest.raises(ValueError, match=word):
            mv.predict_proba([payload])


def test_written_atomically_and_never_overwritten(trained, tmp_path, monkeypatch):
    res, _ = trained
    mv = load_model(res.model_dir)
    with pytest.raises(ValueError, match="already exists"):
        save_model_version(res.model_dir, mv.module, mv.config, {}, {})
    import safetensors.torch as st

    def broken(state, path, metadata=None):
        open(path, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(st, "save_file", broken)
    target = tmp_path / "v2"
    with pytest.raises(OSError, match="disk full"):
        save_model_version(target, mv.module, mv.config, {}, {})
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary folder left behind


def test_vector_model_roundtrip(tiny_bert_bundle, tmp_path):
    recs = vector_records(tiny_bert_bundle.bundle_id, "ome", 40)
    res = train_from_records(recs, tmp_path / "ome", bundle=tiny_bert_bundle,
                             cfg=TrainConfig(epochs=2, batch_size=8, progress=False, seed=0,
                                             hidden=(32,)))
    mv = load_model(res.model_dir)
    assert mv.config["architecture"]["in_dim"] == recs[0].payload.data_array().size
    assert mv.config["base_model"] is None
    assert mv.predict_proba([r.payload for r in recs[:3]]).shape == (3, 2)


def test_model_folder_never_stores_raw_text(tiny_bert_dir, tiny_encoder_bundle, tmp_path):
    """Tripwire: no training sentence (nor its rarest word) appears in any file."""
    texts, _, labels = sentiment_texts(20, seed=3)
    texts = [f"{t} secret marker" for t in texts]
    tsv = write_tsv(tmp_path / "train.tsv", texts, labels)
    for mech, params in (("dchi-text", {"eta": 50.0}), ("laplace", {"epsilon": 5.0})):
        out = tmp_path / f"model-{mech}"
        # eta 50 leaves the tiny table's tokens unchanged (below the privacy floor): the
        # strictest tripwire, the payloads are the text's own ids
        train_from_tsv(tsv, out, mech, params, dev_tsv=tsv, bundle=tiny_encoder_bundle,
                       base=tiny_bert_dir if mech == "dchi-text" else None, cfg=FAST,
                       allow_weak_privacy=True)
        blobs = [p.read_bytes() for p in out.rglob("*") if p.is_file()]
        assert blobs
        for blob in blobs:
            assert b"marker" not in blob
            for t in texts:
                assert t.encode() not in blob
