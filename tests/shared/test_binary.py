"""OME (and SUE/OUE baselines): fixed-point encoding and randomized-response flip rates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from shared.mechanisms import OME, OUE, SUE, z_score


def test_flip_probabilities_match_theorem_1_by_hand():
    ome = OME(epsilon=1.0, lam=100.0, dim=384)
    p_even, p_odd, q = ome.flip_probabilities()
    assert ome.n_bits == 3840
    assert p_even == pytest.approx(100 / 101)
    assert p_odd == pytest.approx(1 / (1 + 100**3))
    assert q == pytest.approx(1 / (1 + 100 * math.exp(1 / 3840)))


def test_encoding_layout_sign_integer_fraction():
    ome = OME(1.0, 10.0, dim=2)
    # z-scores of [a, b] are [-1, 1]: sign bit, 4 integer bits, 5 fraction bits
    bits = ome.encode(np.array([0.0, 2.0]))
    np.testing.assert_array_equal(bits[:10], [1, 0, 0, 0, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(bits[10:], [0, 0, 0, 0, 1, 0, 0, 0, 0, 0])


@settings(max_examples=50)
@given(arrays(np.float64, st.integers(2, 40), elements=st.floats(-1e3, 1e3)))
def test_decode_inverts_encode_up_to_the_fraction_step(v):
    ome = OME(1.0, 10.0, dim=v.size)
    z = z_score(v)
    dec = ome.decode(ome.encode(v))
    clipped = np.clip(z, -ome.max_abs, ome.max_abs)
    assert (np.abs(dec - clipped) <= 2.0**-5 + 1e-12).all()
    assert set(np.unique(ome.encode(v))) <= {0, 1}


@pytest.mark.parametrize("mech", [OME(1.0, 100.0, dim=64), OME(5.0, 2.0, dim=64),
                                  SUE(50.0, dim=64), OUE(50.0, dim=64)])
def test_empirical_flip_rates_match_the_formulas(mech):
    """Binomial tolerance: 5 standard deviations over 4,000 vectors of 640 bits."""
    rng = np.random.default_rng(0)
    reps = 4000
    p, q = mech.bit_probabilities()
    ones = mech.perturb(np.ones((reps, mech.n_bits), np.uint8), rng).mean(axis=0)
    zeros = mech.perturb(np.zeros((reps, mech.n_bits), np.uint8), rng).mean(axis=0)
    for rate, expected in ((ones, p), (zeros, np.full(mech.n_bits, q))):
        # pool bits with the same probability (even / odd positions)
        for parity in (0, 1):
            sel = np.arange(mech.n_bits) % 2 == parity
            pe = expected[sel][0]
            sd = math.sqrt(pe * (1 - pe) / (reps * sel.sum()))
            assert abs(rate[sel].mean() - pe) <= 5 * sd + 1e-12
    # A sampler that swapped even and odd probabilities would be caught:
    if isinstance(mech, OME):
        assert abs(ones[0::2].mean() - p[1]) > 0.1


def test_perturb_validates_bits_and_reproduces_with_seed():
    ome = OME(1.0, 10.0, dim=3)
    bits = ome.encode(np.array([1.0, 2.0, 4.0]))
    a = ome.perturb(bits, np.random.default_rng(3))
    np.testing.assert_array_equal(a, ome.perturb(bits, np.random.default_rng(3)))
    with pytest.raises(ValueError, match="0 or 1"):
        ome.perturb(bits * 2)
    with pytest.raises(ValueError, match="30 values"):
        ome.perturb(bits[:-1])
    with pytest.raises(ValueError, match="NaN or Inf"):
        ome.encode(np.array([1.0, np.nan, 0.0]))


@pytest.mark.parametrize(("kwargs", "name"), [({"epsilon": 0, "lam": 1, "dim": 4}, "epsilon"),
                                              ({"epsilon": 1, "lam": 0, "dim": 4}, "lam"),
                                              ({"epsilon": 1, "lam": -2, "dim": 4}, "lam"),
                                              ({"epsilon": 1, "lam": 1, "dim": 0}, "dim")])
def test_ome_parameters_out_of_range(kwargs, name):
    with pytest.raises(ValueError, match=name):
        OME(**kwargs)


def test_sue_and_oue_probabilities_by_hand():
    a = 2.0 / 160  # ε / (r·l), r = 16, l = 10
    p, q = SUE(2.0, 16).bit_probabilities()
    assert p == pytest.approx(np.full(160, math.exp(a) / (1 + math.exp(a))))
    assert q == pytest.approx(1 / (1 + math.exp(a)))
    p, q = OUE(2.0, 16).bit_probabilities()
    assert p == pytest.approx(np.full(160, 0.5))
    assert q == pytest.approx(1 / (1 + math.exp(a)))


@pytest.mark.parametrize("mech", [lambda: OME(1.0, 1e200, 4), lambda: OME(1e6, 2.0, 1),
                                  lambda: SUE(1e5, 1), lambda: OUE(1e5, 1)])
def test_extreme_parameters_give_probabilities_not_overflow(mech):
    """Huge but finite λ or ε: probabilities in [0, 1], no OverflowError."""
    from shared.accounting import guarantee

    m = mech()
    p, q = m.bit_probabilities()
    assert ((p >= 0) & (p <= 1)).all() and 0 <= q <= 1
    assert guarantee(m)["worst_case"]["epsilon"] >= 0  # inf where a bit became deterministic
    out = m.perturb(np.zeros(m.n_bits, dtype=np.uint8), np.random.default_rng(0))
    assert set(np.unique(out)) <= {0, 1}
