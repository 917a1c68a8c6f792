"""(m, k)-TextHide: mixing weights, masks from the pool, labels mixed with the same weights."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from shared.mechanisms import TextHide

ALPHA = 1e-3


def one_hot_batch(b):
    return np.eye(b), np.eye(b)  # reps = labels, so the mixing of both can be compared


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("weights", ["abs-normal", "dirichlet", "equal"])
def test_hidden_is_masked_mix_and_labels_use_the_same_weights(k, weights):
    b = 32
    th = TextHide(m=8, k=k, dim=b, seed=1, weights=weights)
    reps, labels = one_hot_batch(b)
    hidden, mixed = th.encrypt(reps, labels, np.random.default_rng(0))
    assert hidden.shape == (b, b) and mixed.shape == (b, b)
    # mixed weights: non-negative, sum to 1, own example always included (π_1 = identity)
    np.testing.assert_allclose(mixed.sum(axis=1), 1.0)
    assert (mixed >= 0).all() and (mixed[np.arange(b), np.arange(b)] > 0).all()
    assert ((mixed > 0).sum(axis=1) <= k).all()
    # |hidden| is the mix of the representations: same weights as the labels
    np.testing.assert_allclose(np.abs(hidden), mixed, atol=1e-6)
    # each sign pattern is one of the m masks of the pool
    for row, mix in zip(hidden, mixed, strict=True):
        nz = mix > 0
        assert any((np.sign(row[nz]) == mask[nz]).all() for mask in th.pool)


def test_k1_is_mask_only_and_invertible_with_the_mask():
    th = TextHide(m=4, k=1, dim=16, seed=3)
    reps = np.random.default_rng(0).normal(size=(10, 16))
    hidden, none = th.encrypt(reps, None, np.random.default_rng(1))
    assert none is None
    assert all(any(np.allclose(h * mask, r, atol=1e-6) for mask in th.pool)
               for h, r in zip(hidden, reps, strict=True))


def test_masks_are_drawn_uniformly_from_the_pool():
    th = TextHide(m=8, k=1, dim=64, seed=0)
    reps = np.ones((4000, 64))
    hidden, _ = th.encrypt(reps, None, np.random.default_rng(2))
    idx = [int(np.flatnonzero((th.pool == np.sign(h)).all(axis=1))[0]) for h in hidden]
    counts = np.bincount(idx, minlength=8)
    assert stats.chisquare(counts).pvalue > ALPHA


def test_pool_is_determined_by_the_seed():
    a, b = TextHide(16, 2, 32, seed=5), TextHide(16, 2, 32, seed=5)
    np.testing.assert_array_equal(a.pool, b.pool)
    assert set(np.unique(a.pool)) == {-1, 1}
    assert not np.array_equal(TextHide(16, 2, 32).pool, TextHide(16, 2, 32).pool)


@pytest.mark.parametrize("weights", ["abs-normal", "dirichlet"])
def test_k2_weight_distribution(weights):
    """k=2: Dirichlet(1,1) gives λ1 ~ U(0,1); |N(0,I_2)| normalised gives λ1 = cosθ/(cosθ+sinθ),
    θ ~ U(0, π/2). KS test at α = 1e-3 against the right law, and rejection of the other."""
    th = TextHide(m=1, k=2, dim=1, seed=0, weights=weights)
    lam = th.mixing_weights(20_000, np.random.default_rng(4))[:, 0]
    uniform_cdf = stats.uniform.cdf

    def abs_normal_cdf(x):
        # λ ≤ x  <=>  tanθ ≥ 1/x - 1  <=>  θ ≥ atan(1/x - 1)
        x = np.clip(x, 1e-12, 1)
        return 1 - np.arctan(1 / x - 1) / (np.pi / 2)

    right, wrong = (uniform_cdf, abs_normal_cdf) if weights == "dirichlet" else (abs_normal_cdf, uniform_cdf)
    assert stats.kstest(lam, right).pvalue > ALPHA
    assert stats.kstest(lam, wrong).pvalue < 1e-6


@pytest.mark.parametrize(("kwargs", "name"), [({"m": 0, "k": 1, "dim": 4}, "m"),
                                              ({"m": 1, "k": 0, "dim": 4}, "k"),
                                              ({"m": 1, "k": 1, "dim": 4, "weights": "x"}, "weights")])
def test_parameters_out_of_range(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TextHide(**kwargs)


def test_k_larger_than_batch_and_bad_arrays():
    th = TextHide(4, 3, 8, seed=0)
    with pytest.raises(ValueError, match="k must be <= the batch size 2"):
        th.encrypt(np.ones((2, 8)), None)
    with pytest.raises(ValueError, match="NaN or Inf"):
        th.encrypt(np.full((4, 8), np.nan), None)
    with pytest.raises(ValueError, match="one row per"):
        th.encrypt(np.ones((4, 8)), np.ones((3, 2)))
