"""Privacy evaluation: the torch nearest-token search equals the shared exact search, the
token report runs on it, and the attacker MLP finds a planted signal and not a missing one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.attacks.attack import (
    TorchDChiText,
    content_words,
    format_vector_attack,
    roc_auc,
    token_privacy,
    train_attacker,
    vector_attack,
    word_presence,
)
from shared.mechanisms import DChiText, Laplace
from tests.models.conftest import sentiment_texts


def test_torch_dchi_text_is_the_shared_mechanism(tiny_bert_bundle):
    ids = np.tile(tiny_bert_bundle.regular_ids, 20)  # the search of the torch candidate pass
    a = DChiText(tiny_bert_bundle, 30.0).privatize_ids(ids, np.random.default_rng(5))
    b = TorchDChiText(tiny_bert_bundle, 30.0, "cpu").privatize_ids(ids,
                                                                    np.random.default_rng(5))
    assert np.array_equal(a, b)
    assert np.isin(b, tiny_bert_bundle.regular_ids).all()


def test_token_privacy_report(tiny_bert_bundle):
    texts, _, _ = sentiment_texts(40)
    rep = token_privacy(tiny_bert_bundle, "dchi-text", eta=40.0, texts=texts, tokens="all",
                        samples=50, inversion_tokens=500, rng=np.random.default_rng(0),
                        device="cpu")
    assert rep.tokens == tiny_bert_bundle.regular_ids.size and rep.samples == 50
    assert ((rep.n_w >= 0) & (rep.n_w <= 50)).all() and ((rep.s_w >= 1) & (rep.s_w <= 50)).all()
    accs = [a for _, a in sorted(rep.table)]
    assert all(x <= y for x, y in zip(accs, accs[1:], strict=False))  # monotone in eta
    tgt = token_privacy(tiny_bert_bundle, "dchi-embedding", target=0.5, texts=texts, tokens=5,
                        samples=10, inversion_tokens=2000, rng=np.random.default_rng(1),
                        device="cpu", tol=0.02)
    # 2000 tokens: a step of 1/2000 is well inside the tolerance of 0.02
    assert abs(tgt.inversion_accuracy - 0.5) <= 0.02
    with pytest.raises(ValueError, match="either"):
        token_privacy(tiny_bert_bundle, "dchi-text", texts=texts)


def test_roc_auc_known_values():
    y = np.array([0, 0, 1, 1])
    assert roc_auc(np.array([0.1, 0.2, 0.8, 0.9]), y) == 1.0
    assert roc_auc(np.array([0.9, 0.8, 0.2, 0.1]), y) == 0.0
    assert roc_auc(np.array([0.5, 0.5, 0.5, 0.5]), y) == 0.5
    assert np.isnan(roc_auc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_content_words_and_presence():
    texts = ["The movie was great", "a great film", "the film, the movie", "great!"]
    words = content_words(texts, n=2)
    assert words == ["great", "film"]  # 'the', 'was', 'a' are stop words; ties by name
    assert word_presence(texts, words).tolist() == [[1, 0], [1, 1], [0, 1], [1, 0]]


def test_attacker_finds_a_planted_signal_and_not_a_missing_one():
    rng = np.random.default_rng(0)
    n, w, d = 600, 4, 32
    y = (rng.random((n, w)) < 0.3).astype(np.float32)
    signal = y @ rng.normal(0, 1, (w, d)) + rng.normal(0, 0.3, (n, d))
    noise = rng.normal(0, 1, (n, d))
    tr, te = np.arange(400), np.arange(400, n)
    torch.manual_seed(0)
    found = train_attacker(signal[tr], y[tr], signal[te], y[te], epochs=15, device="cpu",
                           seed=0)
    blind = train_attacker(noise[tr], y[tr], noise[te], y[te], epochs=15, device="cpu", seed=0)
    assert found["mean"]["auc"] > 0.9 and found["mean"]["accuracy"] > found["mean"][
        "majority_accuracy"]
    # 200 test rows at prevalence 0.3: the AUC of a blind attacker has sd of about 0.04
    assert abs(blind["mean"]["auc"] - 0.5) < 0.12
    assert len(found["per_word"]) == w


def test_vector_attack_runs_on_laplace_payloads(tiny_encoder_bundle):
    texts, _, _ = sentiment_texts(80, seed=2)
    rep = vector_attack(tiny_encoder_bundle, Laplace(5.0, "coordinate"), texts, n_words=5,
                        rng=np.random.default_rng(0), device="cpu", epochs=3, progress=False)
    assert rep["sentences"] == 80 and rep["train"] + rep["test"] == 80
    assert len(rep["words"]) == 5
    assert set(rep["attacker"]["mean"]) == {"accuracy", "majority_accuracy", "f1", "auc"}
    assert "reference_unprivatized" in rep
    assert rep["guarantee"]["worst_case"]["epsilon"] == pytest.approx(5.0 * 16)
    with pytest.raises(ValueError, match="laplace, ome and texthide"):
        vector_attack(tiny_encoder_bundle, DChiText(tiny_encoder_bundle, 5.0), texts)


def test_vector_attack_measures_weak_parameters_and_says_so(tiny_encoder_bundle):
    """The floor refuses ε = 1e12 on the edge; an attack is how one shows why, so it runs,
    the attacker does about as well as on clean vectors, and the report names the floor."""
    texts, _, _ = sentiment_texts(80, seed=2)
    kw = dict(n_words=5, device="cpu", epochs=3, progress=False)
    weak = vector_attack(tiny_encoder_bundle, Laplace(1e12, "coordinate"), texts,
                         rng=np.random.default_rng(0), **kw)
    assert "privacy floor" in weak["weak_privacy"]
    assert "WEAK PRIVACY" in format_vector_attack(weak)
    ok = vector_attack(tiny_encoder_bundle, Laplace(5.0, "coordinate"), texts,
                       rng=np.random.default_rng(0), **kw)
    assert ok["weak_privacy"] is None and "WEAK PRIVACY" not in format_vector_attack(ok)


def test_attacker_constant_training_coordinate_keeps_scale_one():
    """A bit never set in training but set at test time must not be blown up by 1/1e-6
    (which drowned the real signal in the logits before the fix)."""
    rng = np.random.default_rng(1)
    n, w, d = 600, 2, 16
    y = (rng.random((n, w)) < 0.4).astype(np.float32)
    x = y @ rng.normal(0, 1, (w, d)) + rng.normal(0, 0.3, (n, d))
    x = np.concatenate([x, np.zeros((n, 8))], axis=1)  # 8 coordinates constant in training
    tr, te = np.arange(400), np.arange(400, n)
    x[te, -8:] = 1.0  # ... and set at test time
    rep = train_attacker(x[tr], y[tr], x[te], y[te], epochs=15, device="cpu", seed=0)
    assert rep["mean"]["auc"] > 0.9
