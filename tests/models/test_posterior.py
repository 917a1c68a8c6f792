"""The channel posterior (models.training.posterior): Bayes' rule over the exact mechanism, the
tables it yields, and the checks that keep a table to its own mechanism, η and bundle."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.training.posterior import ChannelPosterior, build_posterior, draws_per_token
from shared.mechanisms import DChiText

ETA = 4.0  # on the tiny table (16-d, N(0, 0.5) rows): about half the tokens change


def _texts(bundle, words: list[str], counts: list[int]) -> list[str]:
    return [" ".join([w] * c) for w, c in zip(words, counts, strict=True)]


def _skewed(bundle):
    """Ten words of the tiny vocabulary with counts 1, 2, 4, ..., 512: a prior far from
    uniform, so that P(x | y) differs from P(y | x) normalised over x."""
    vocab = bundle.tokenizer.get_vocab()
    words = ["the", "a", "movie", "film", "good", "bad", "great", "awful", "is", "was"]
    return words, [vocab[w] for w in words], [2 ** i for i in range(len(words))]


def test_posterior_is_bayes_rule_over_the_exact_mechanism(tiny_bert_bundle):
    """The table's P(x | y) matches P(x)·P(y | x) / P(y) with P(y | x) estimated separately by
    running DChiText directly. Compared on every output y with P(y) >= 5%: the table saw each
    over 5,000 times (100 runs per occurrence of 1,023 tokens), the reference over 10,000
    (200 per occurrence), so a posterior share there has a standard error below 0.01 for the
    two together; tolerance 0.05. Reading P(y | x) as if it were P(x | y) (x and y swapped,
    or the prior dropped) misses by more than 0.2."""
    b = tiny_bert_bundle
    words, ids, counts = _skewed(b)
    table = build_posterior(b, "dchi-text", ETA, _texts(b, words, counts), passes=100,
                            min_draws=200, rng=np.random.default_rng(0))
    mech = DChiText(b, ETA)
    rng = np.random.default_rng(1)
    joint = np.zeros((b.vocab_size, b.vocab_size))
    for x, c in zip(ids, counts, strict=True):
        ys = mech.privatize_ids(np.full(200 * c, x), rng)
        joint[x] += c * np.bincount(ys, minlength=b.vocab_size) / (200 * c)
    ref = joint / np.maximum(joint.sum(axis=0, keepdims=True), 1e-300)  # P(x | y)
    x, y, p = table.pairs()
    got = np.zeros_like(ref)
    got[x, y] = p
    p_y = joint.sum(axis=0) / joint.sum()
    solid = p_y >= 0.05
    assert solid.sum() >= 3
    assert np.abs(got - ref)[:, solid].max() < 0.05
    # P(y | x), read as if it were P(x | y)
    wrong_way = joint / np.maximum(joint.sum(axis=1, keepdims=True), 1e-300)
    assert np.abs(got - wrong_way)[:, solid].max() > 0.2
    # each y's posterior sums to one
    sums = np.zeros(b.vocab_size)
    np.add.at(sums, y, p)
    assert np.allclose(sums[np.unique(y)], 1.0)
    # the frequent word wins the posterior of outputs it shares with rare ones
    assert got[ids[-1]].sum() > got[ids[0]].sum()


def test_mean_table_and_map_ids(tiny_bert_bundle):
    b = tiny_bert_bundle
    words, ids, counts = _skewed(b)
    table = build_posterior(b, "dchi-text", ETA, _texts(b, words, counts), passes=2,
                            rng=np.random.default_rng(2))
    emb = b.embeddings
    mean = table.mean_table(emb)
    x, y, p = table.pairs()
    seen = np.unique(y)
    want = np.zeros((seen.size, emb.shape[1]))
    for k, yy in enumerate(seen):
        sel = y == yy
        want[k] = (p[sel, None] * emb[x[sel]]).sum(axis=0)
    assert np.allclose(mean[seen], want, atol=1e-5)
    unseen = np.setdiff1d(np.arange(b.vocab_size), seen)
    assert unseen.size and np.array_equal(mean[unseen], emb[unseen])  # specials among them
    m = table.map_ids()
    for yy in seen:
        sel = y == yy
        assert p[sel][x[sel] == m[yy]][0] == p[sel].max()
    assert np.array_equal(m[unseen], unseen)


def test_draws_follow_the_text_so_frequent_tokens_are_not_overstated():
    counts = np.array([0, 1, 3, 1000])
    assert draws_per_token(counts, 1.0, 16).tolist() == [0, 16, 16, 1000]
    assert draws_per_token(counts, 2.5, 4).tolist() == [0, 4, 8, 2500]


def test_a_table_is_refused_for_another_mechanism_eta_or_bundle(tiny_bert_bundle, tmp_path):
    b = tiny_bert_bundle
    table = build_posterior(b, "dchi-text", ETA, ["good film", "bad film"],
                            rng=np.random.default_rng(3))
    table.check_for("dchi-text", {"eta": ETA}, b.bundle_id)
    with pytest.raises(ValueError, match="built for dchi-text, not dchi-embedding"):
        table.check_for("dchi-embedding", {"eta": ETA}, b.bundle_id)
    with pytest.raises(ValueError, match="eta=4"):
        table.check_for("dchi-text", {"eta": ETA * 1.001}, b.bundle_id)
    with pytest.raises(ValueError, match="bundle"):
        table.check_for("dchi-text", {"eta": ETA}, "0" * 64)
    with pytest.raises(ValueError, match="makes no sense for laplace"):
        build_posterior(b, "laplace", 1.0, ["good film"])
    # files: a round trip keeps everything; anything else is refused in one line
    path = table.save(tmp_path / "p.npz")
    back = ChannelPosterior.load(path)
    assert back.describe() == table.describe()
    assert all(np.array_equal(u, v) for u, v in zip(back.pairs(), table.pairs(), strict=True))
    (tmp_path / "bad.npz").write_bytes(b"not a table")
    with pytest.raises(ValueError, match="not a posterior table"):
        ChannelPosterior.load(tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="no such posterior table"):
        ChannelPosterior.load(tmp_path / "missing.npz")


def test_embedding_posterior_is_the_exact_bayes_mean(tiny_bert_dir, tiny_bert_bundle):
    """EmbeddingClassifier's E[φ(x) | z] equals a float64 numpy evaluation of
    Σ_x softmax(log P(x) − η‖z − φ(x)‖) φ(x) over the regular tokens."""
    from models.nets.backbone import load_bert
    from models.nets.classifiers import build_classifier

    b = tiny_bert_bundle
    words, ids, counts = _skewed(b)
    table = build_posterior(b, "dchi-embedding", ETA, _texts(b, words, counts))
    assert table.pairs is not None and not len(table.pair_x)  # the prior only
    model = build_classifier("dchi-embedding", 2, bert=load_bert(tiny_bert_dir),
                             posterior=table, regular_ids=b.regular_ids)
    rng = np.random.default_rng(4)
    z = b.embeddings[ids[:5]] + rng.normal(0, 0.4, (5, b.dim))
    got = model.posterior_mean(torch.from_numpy(z.astype(np.float32))).numpy()
    lp = table.log_prior(b.regular_ids).astype(np.float64)
    reg = np.isfinite(lp)
    e = b.embeddings[reg].astype(np.float64)
    d = np.linalg.norm(z[:, None, :] - e[None], axis=-1)
    logits = lp[reg] - ETA * d
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    want = (w / w.sum(axis=1, keepdims=True)) @ e
    assert np.allclose(got, want, atol=1e-4)
    assert not np.isfinite(lp[list(b.special_ids.values())]).any()  # specials never
