"""DPNR Laplace mechanism: scaling, noise scale per calibration, word-dropout epsilon."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import stats

from shared.mechanisms import Laplace, dropout_epsilon, min_max_scale

ALPHA = 1e-3


@given(arrays(np.float64, st.integers(1, 50), elements=st.floats(-1e6, 1e6)))
def test_min_max_scale_lands_in_unit_interval(v):
    s = min_max_scale(v)
    assert s.shape == v.shape
    assert (s >= 0).all() and (s <= 1).all()
    if v.max() > v.min():
        assert s.min() == 0 and s.max() == 1
    else:
        assert (s == 0).all()


@pytest.mark.parametrize(("calibration", "expected_scale"), [("vector", 64 / 2.0), ("coordinate", 1 / 2.0)])
def test_noise_is_laplace_with_the_calibrated_scale(calibration, expected_scale):
    mech = Laplace(2.0, calibration=calibration)
    assert mech.scale(64) == expected_scale
    vec = np.linspace(-3, 5, 64)
    batch = np.tile(vec, (3000, 1))  # 192,000 noise draws
    noise = (mech.privatize(batch, np.random.default_rng(0)) - min_max_scale(vec)).ravel()
    # KS against Laplace(0, b): a wrong scale by 2% is rejected at this sample size.
    assert stats.kstest(noise, stats.laplace(scale=expected_scale).cdf).pvalue > ALPHA
    assert np.abs(noise).mean() == pytest.approx(expected_scale, rel=0.01)  # MLE of b
    wrong = stats.kstest(noise, stats.laplace(scale=expected_scale * 1.02).cdf).pvalue
    assert wrong < ALPHA


def test_single_vector_and_validation():
    mech = Laplace(1.0)
    out = mech.privatize(np.arange(8.0), np.random.default_rng(1))
    assert out.shape == (8,)
    np.testing.assert_array_equal(out, Laplace(1.0).privatize(np.arange(8.0), np.random.default_rng(1)))
    for bad in (np.array([1.0, np.nan]), np.array([np.inf, 0.0]), np.zeros((2, 2, 2))):
        with pytest.raises(ValueError):
            mech.privatize(bad)


@pytest.mark.parametrize("kwargs", [{"epsilon": 0}, {"epsilon": -1}, {"epsilon": float("nan")},
                                    {"epsilon": 1, "word_dropout": 1.0}, {"epsilon": 1, "word_dropout": -0.1},
                                    {"epsilon": 1, "calibration": "per-token"}])
def test_parameters_out_of_range(kwargs):
    name = next(k for k in ("word_dropout", "calibration") if k in kwargs) if len(kwargs) > 1 else "epsilon"
    with pytest.raises(ValueError, match=name):
        Laplace(**kwargs)


def test_dropout_epsilon_formula():
    # ε' = ln((1-μ)e^ε + μ), Lyu et al. 2020 Theorem 2, by hand:
    assert dropout_epsilon(1.0, 0.0) == pytest.approx(1.0)
    assert dropout_epsilon(1.0, 0.5) == pytest.approx(math.log(0.5 * math.e + 0.5))
    assert dropout_epsilon(3.0, 0.1) == pytest.approx(math.log(0.9 * math.exp(3) + 0.1))
    assert dropout_epsilon(500.0, 0.1) == pytest.approx(500 + math.log(0.9))  # no overflow


def test_empty_vector_is_refused_with_its_dimension():
    with pytest.raises(ValueError, match="dimension r >= 1"):
        Laplace(1.0).privatize(np.array([]))
