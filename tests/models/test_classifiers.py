"""Classifiers per payload kind: each learns a fixed batch, predicts, and leaves the frozen
word-embedding table bit-identical."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.nets.backbone import check_same_bundle, load_bert
from models.nets.classifiers import (
    EmbeddingClassifier,
    TokenClassifier,
    VectorMLP,
    build_classifier,
    classification_loss,
)
from models.training.data import collate_dataset, dataset_from_records
from models.training.finetune import TrainConfig, build_model, finetune, predict_dataset
from tests.models.conftest import sentiment_texts, token_records, vector_records

KINDS = ["none", "dchi-text", "dchi-embedding", "laplace", "ome", "texthide"]


def _dataset(kind, bundle, n=32, pairs=False, seed=0):
    texts, second, labels = sentiment_texts(n, seed=seed, pairs=pairs)
    if kind in ("none", "dchi-text", "dchi-embedding"):
        recs = token_records(bundle, kind, texts, labels, pairs=second, eta=50.0, seed=seed)
    else:
        recs = vector_records(bundle.bundle_id, kind, n, seed=seed)
    return dataset_from_records(recs, None)


@pytest.mark.parametrize("kind", KINDS)
def test_classifier_learns_a_fixed_batch_and_predicts(kind, tiny_bert_dir, tiny_bert_bundle):
    torch.manual_seed(0)
    ds = _dataset(kind, tiny_bert_bundle)
    model = build_model(ds, tiny_bert_bundle, tiny_bert_dir, TrainConfig(hidden=(64, 64)))
    expected = {"none": TokenClassifier, "dchi-text": TokenClassifier,
                "dchi-embedding": EmbeddingClassifier}.get(kind, VectorMLP)
    assert isinstance(model, expected)
    idx = np.arange(len(ds))
    batch = collate_dataset(ds, idx, tiny_bert_bundle.special_ids, 32)
    target = torch.from_numpy(ds.targets[idx])
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    losses = []
    for _ in range(40):
        loss = classification_loss(model(**batch), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    # the loss on the batch must fall clearly (soft TextHide targets have an entropy floor)
    assert losses[-1] < 0.6 * losses[0], losses[::10]
    model.eval()
    with torch.no_grad():
        probs = torch.softmax(model(**batch), dim=-1)
    assert probs.shape == (len(ds), 2)
    assert torch.allclose(probs.sum(dim=1), torch.ones(len(ds)))


def test_soft_cross_entropy_equals_hard_for_one_hot():
    logits = torch.randn(5, 3)
    y = torch.tensor([0, 2, 1, 1, 0])
    hard = classification_loss(logits, y)
    soft = classification_loss(logits, torch.nn.functional.one_hot(y, 3).float())
    assert torch.allclose(hard, soft)


@pytest.mark.parametrize("kind", ["dchi-text", "dchi-embedding"])
def test_frozen_embeddings_bit_identical_after_finetune(kind, tiny_bert_dir, tiny_bert_bundle):
    ds = _dataset(kind, tiny_bert_bundle, n=24)
    before = {k: v.clone() for k, v in load_bert(tiny_bert_dir).state_dict().items()}
    res = finetune(ds, ds, tiny_bert_bundle, tiny_bert_dir,
                   TrainConfig(epochs=2, lr=1e-3, batch_size=8, progress=False, seed=0))
    w = res.module.bert.embeddings.word_embeddings.weight
    assert not w.requires_grad
    assert np.array_equal(w.detach().numpy(), tiny_bert_bundle.embeddings)
    check_same_bundle(res.module.bert, tiny_bert_bundle)
    # the rest of BERT did train
    after = res.module.bert.state_dict()
    changed = [k for k in before if k in after and not torch.equal(before[k], after[k])]
    assert any("encoder.layer" in k for k in changed)
    assert "embeddings.word_embeddings.weight" not in changed
    assert res.metrics["dev"]["n"] == len(ds) and len(res.history) == 2


def test_sentence_pairs_train_and_predict(tiny_bert_dir, tiny_bert_bundle):
    ds = _dataset("dchi-text", tiny_bert_bundle, n=24, pairs=True)
    assert all(s is not None and len(s) == 2 for s in ds.segments)
    batch = collate_dataset(ds, range(4), tiny_bert_bundle.special_ids, 32)
    assert batch["token_type_ids"].sum() > 0
    res = finetune(ds, ds, tiny_bert_bundle, tiny_bert_dir,
                   TrainConfig(epochs=1, lr=1e-3, batch_size=8, progress=False, seed=0))
    assert res.metrics["dev"]["n"] == 24 and len(res.metrics["dev"]["per_class"]) == 2
    proba = predict_dataset(res.module, ds, tiny_bert_bundle.special_ids, 32)[0]
    # the pair's second segment matters: swapping the segments changes the prediction
    swapped = ds.subset(range(len(ds)))
    swapped.arrays = [np.concatenate([a[s[0]:], a[:s[0]]]) for a, s in
                      zip(ds.arrays, ds.segments, strict=True)]
    swapped.segments = [(s[1], s[0]) for s in ds.segments]
    other = predict_dataset(res.module, swapped, tiny_bert_bundle.special_ids, 32)[0]
    assert not np.allclose(proba, other)


def test_the_best_epoch_is_the_one_kept(tiny_bert_bundle, monkeypatch):
    """Dev accuracy 0.9 after epoch 1, 0.5 after epoch 2: the returned weights are the
    epoch-1 weights, not the last ones."""
    import models.training.finetune as ft

    ds = _dataset("laplace", tiny_bert_bundle, n=40)
    scores = iter([0.9, 0.5, 0.9])
    real = ft.evaluate_dataset

    def fake(*a, **k):
        rep = real(*a, **k)
        rep["accuracy"] = next(scores)
        return rep

    monkeypatch.setattr(ft, "evaluate_dataset", fake)
    snaps = {}

    def grab(frac, info):
        snaps[info["epoch"]] = {k: v.clone() for k, v in res_module[0].state_dict().items()}

    res_module = [build_model(ds, tiny_bert_bundle, None, TrainConfig(hidden=(16,), seed=0))]
    res = finetune(ds, ds, tiny_bert_bundle, None,
                   TrainConfig(epochs=2, lr=1e-2, batch_size=8, progress=False, seed=0,
                               hidden=(16,)), on_progress=grab, model=res_module[0])
    assert res.best_epoch == 1 and res.metrics["best_epoch"] == 1
    final = res.module.state_dict()
    assert all(torch.equal(final[k], snaps[1][k]) for k in final)
    assert any(not torch.equal(final[k], snaps[2][k]) for k in final)


def test_any_number_of_labels(tiny_bert_dir, tiny_bert_bundle):
    recs = vector_records(tiny_bert_bundle.bundle_id, "laplace", 60, n_labels=3)
    ds = dataset_from_records(recs, None)
    assert ds.label_names == ["0", "1", "2"]
    res = finetune(ds, ds, tiny_bert_bundle, cfg=TrainConfig(epochs=8, batch_size=16,
                                                            progress=False, seed=0,
                                                            hidden=(64,)))
    assert res.module.num_labels == 3
    assert res.metrics["dev"]["accuracy"] > 0.8  # separable classes, eps = 1e3: near-clean


def test_build_classifier_refuses_bad_input(tiny_bert_dir):
    with pytest.raises(ValueError, match="dimension"):
        build_classifier("laplace", 2)
    with pytest.raises(ValueError, match="BERT"):
        build_classifier("dchi-text", 2)
    with pytest.raises(ValueError, match="at least 2"):
        build_classifier("dchi-text", 1, bert=load_bert(tiny_bert_dir))
    with pytest.raises(ValueError, match="unknown mechanism"):
        build_classifier("rot13", 2)


def test_input_scaling_leaves_a_constant_training_coordinate_unscaled():
    """An OME bit never set in training must not be multiplied by 1/std ~ 1e6 when it is set at
    inference (the dev loss of a small OME run reached 47,000 before this floor)."""
    torch.manual_seed(0)
    x = torch.rand(200, 8)
    x[:, 0] = 0.0  # constant in training
    x[:, 1] = 0.5 + 1e-5 * torch.randn(200)  # nearly constant
    mlp = VectorMLP(8, 2, hidden=(16,))
    mlp.fit_input_scaling(x)
    assert mlp.scale[0] == 1.0 and mlp.scale[1] == 1.0
    assert torch.allclose(mlp.scale[2:], x[:, 2:].std(dim=0))
    probe = x[:1].clone()
    probe[0, 0] = 1.0  # first seen at inference
    standardised = (probe - mlp.shift) / mlp.scale
    assert standardised.abs().max() < 10.0
    one = VectorMLP(8, 2, hidden=(16,))
    one.fit_input_scaling(x[:1])
    assert torch.equal(one.scale, torch.ones(8))


def test_ema_keeps_the_moving_average_of_the_weights(tiny_bert_dir, tiny_bert_bundle):
    """--ema: the model kept (and evaluated) is the moving average of the weights: with a
    decay near 0 it is the last step's weights, the same run without EMA (same seed); with
    0.9 it lags behind them. The frozen word table stays bit-identical either way."""
    ds = _dataset("dchi-text", tiny_bert_bundle, n=24)

    def run(ema):
        cfg = TrainConfig(epochs=2, lr=1e-3, batch_size=8, progress=False, seed=0, ema=ema)
        return finetune(ds, None, tiny_bert_bundle, tiny_bert_dir, cfg)

    plain, near0, slow = run(0.0), run(1e-12), run(0.9)
    layer = "bert.encoder.layer.0.attention.self.query.weight"
    w = {k: r.module.state_dict()[layer] for k, r in
         (("plain", plain), ("near0", near0), ("slow", slow))}
    assert torch.allclose(w["near0"], w["plain"], atol=1e-6)
    assert (w["slow"] - w["plain"]).abs().max() > 1e-4
    for r in (near0, slow):
        assert np.array_equal(r.module.bert.embeddings.word_embeddings.weight.detach().numpy(),
                              tiny_bert_bundle.embeddings)
    assert slow.metrics["ema"] == 0.9 and plain.metrics["ema"] == 0.0
    with pytest.raises(ValueError, match="EMA decay"):
        TrainConfig(ema=1.0).validate()
