"""The privacy floor (shared.floor) and the refusal of parameters the arithmetic cannot carry.

Statistical comparisons state their tolerance: the floor's estimate has its own sampling
error (pairs of a token and a direction) and is compared with a Monte Carlo run of the
mechanism itself, within 4 standard errors of both.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from shared import floor
from shared.floor import (
    DChiFloor,
    WeakPrivacyError,
    check_computable,
    dchi_floor,
    gamma_cdf,
    require_privacy_floor,
    weak_privacy_reason,
)
from shared.mechanisms import (
    OME,
    OUE,
    SUE,
    DChiEmbedding,
    DChiText,
    Laplace,
    TextHide,
    sample_dchi_noise,
)
from shared.mechanisms.computable import check_dchi_eta
from shared.mechanisms.nearest import ExactNearest, brute_force_nearest


@pytest.fixture(autouse=True)
def numpy_warnings_are_errors():
    """No RuntimeWarning may leave any code path here (no warnings on stderr)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.mark.parametrize("n", [1, 2, 16, 384, 768])
def test_gamma_cdf_is_the_regularized_incomplete_gamma(n):
    z = np.concatenate([[0.0, np.inf], np.geomspace(1e-3, 10 * n, 200)])
    # 1 - Pr[Poisson(z) <= n-1]: absolute error ~1e-12 (relative only 1e-6 deep in the lower
    # tail, where it does not move a mean compared with 0.99)
    np.testing.assert_allclose(gamma_cdf(n, z), stats.gamma(a=n).cdf(z), rtol=1e-6, atol=1e-11)


def exit_by_search(table: np.ndarray, row: int, u: np.ndarray) -> float:
    """Distance along x + s u at which the exact nearest row stops being ``row``, by bisection
    with the brute-force search (inf if it never does up to 1e6)."""
    x = table[row].astype(np.float64)

    def stays(s: float) -> bool:
        return brute_force_nearest(table, (x + s * u)[None])[0] == row

    hi = 1.0
    while stays(hi):
        hi *= 2
        if hi > 1e6:
            return math.inf
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if stays(mid) else (lo, mid)
    return hi


def test_exit_distances_are_where_the_nearest_token_changes():
    """s*(x, u) = min over t with u.(t-x) > 0 of ||t-x||²/(2 u.(t-x)): checked against a
    bisection of the exact search along each ray (a wrong factor or sign fails)."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(40, 5)).astype(np.float32)
    f = DChiFloor(table, tokens=60, rng=3)
    for i in range(60):
        want = exit_by_search(table, int(f.rows[i]), f.directions[f.which[i]].astype(np.float64))
        assert f.exit[i] == pytest.approx(want, rel=1e-4) or (
            math.isinf(want) and math.isinf(f.exit[i]))


def test_duplicate_rows_the_search_never_returns_have_exit_zero():
    table = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 0.0], [0.0, 3.0]], dtype=np.float32)
    f = DChiFloor(table, tokens=40, rng=1)
    assert (f.exit[f.rows == 2] == 0).all()  # row 2 = row 0: the tie goes to row 0
    assert (f.exit[f.rows == 0] > 0).all()
    assert ExactNearest(table).search(np.zeros((1, 2)))[0] == 0


def test_a_near_duplicate_does_not_hide_the_other_rows():
    """Rows 0 and 1 differ by 1e-5 at norm 1000: in float32 their distance and u.(t-x) both
    round to 0 (0/0). Every direction from them reaches one of the rows around them, so
    every exit is finite (the NaN once made it inf: "never changes at any eta")."""
    table = np.array([[1000, 0], [1000, 1e-5], [0, 1000], [-1000, 0], [0, -1000], [2000, 0]],
                     dtype=np.float32)
    f = DChiFloor(table, tokens=60, rng=0)
    assert np.isfinite(f.exit[f.rows <= 1]).all(), f.exit[f.rows <= 1]


@pytest.mark.parametrize("eta", [2.0, 5.0, 10.0, 20.0])
def test_unchanged_probability_agrees_with_the_mechanism(tiny_bundle, eta):
    """Estimate (20,000 pairs) vs the share of 20,000 DChiText outputs equal to their input
    (tokens uniform over the regular ones): within 4 combined standard errors."""
    b = tiny_bundle
    f = DChiFloor(b.embeddings[b.regular_ids], tokens=20_000, rng=5)
    est = f.unchanged(eta)
    rng = np.random.default_rng(int(eta))
    ids = rng.choice(b.regular_ids, 20_000)
    got = float((DChiText(b, eta).privatize_ids(ids, rng) == ids).mean())
    se = math.sqrt(max(est * (1 - est), 1e-4) / 20_000 * 2)
    assert abs(got - est) < 4 * se, (got, est)


def test_the_direct_measurement_grows_its_steps_and_stops_when_the_interval_decides(
        minilm_bundle, tiny_bundle):
    """Steps of 32, 32, 64, then 128 (OS entropy, as the floor draws): a third unchanged is
    decided by the first 32 tokens (its Wilson upper bound at z = 5 is near 0.72, so this
    fails only if 32 draws of p = 1/3 come out above 0.9: never, in practice); all unchanged
    is decided at 896, the first of 32, 64, 128, 256, 384, ... with n / (n + 25) > 0.97; a
    table of 32 regular tokens is drawn 32 at a time (a step is at most all of them): 832."""
    same, drawn = floor.measure_unchanged(DChiText(minilm_bundle, 65.0), minilm_bundle)
    assert drawn == floor.MEASURE_FIRST == 32 and same < 0.6 * drawn
    assert floor.measure_unchanged(DChiText(minilm_bundle, 1e6), minilm_bundle) == (896, 896)
    assert floor.wilson_interval(768, 768)[0] <= floor.THRESHOLD < floor.wilson_interval(
        896, 896)[0]
    assert len(tiny_bundle.regular_ids) == 32
    assert floor.measure_unchanged(DChiText(tiny_bundle, 1e6), tiny_bundle) == (832, 832)


def test_floor_eta_is_where_the_estimate_crosses_the_threshold(tiny_bundle):
    f = dchi_floor(tiny_bundle, rng=0)
    eta = f.floor_eta(0.99)
    assert f.unchanged(eta) > 0.99 >= f.unchanged(eta / 1.001)
    assert f.floor_eta(0.9) < eta  # a lower threshold starts earlier
    etas = np.geomspace(0.1, 1e4, 50)
    assert np.all(np.diff([f.unchanged(e) for e in etas]) >= 0)  # monotone in eta


def test_dchi_reasons(tiny_bundle):
    b = tiny_bundle
    floor_eta = floor.dchi_floor_eta(b, rng=0)
    assert weak_privacy_reason(DChiText(b, floor_eta / 2)) is None
    why = weak_privacy_reason(DChiText(b, floor_eta * 4))
    assert why.startswith(f"dchi-text eta={floor_eta * 4:g} is weaker than the privacy floor")
    assert "tokens drawn at random came back unchanged (floor 97.00%" in why
    start = float(why.rsplit("eta=", 1)[1].rstrip(")"))
    assert start == pytest.approx(floor_eta, rel=0.25)  # 256 fresh pairs against 1,000
    assert "\n" not in why
    emb = weak_privacy_reason(DChiEmbedding(1e308), b)
    assert "worst-case epsilon per token" in emb and "not finite" in emb
    assert weak_privacy_reason(DChiEmbedding(floor_eta / 2), b) is None
    with pytest.raises(ValueError, match="pass the bundle"):
        weak_privacy_reason(DChiEmbedding(5.0))


def laplace_boundary(dim: int, threshold: float = floor.THRESHOLD) -> float:
    """The noise scale b at which (1 - e^(-2^-23/b))^r = threshold."""
    return 2.0**-23 / -math.log1p(-threshold ** (1 / dim))


@pytest.mark.parametrize("calibration", ["vector", "coordinate"])
def test_laplace_floor_is_noise_within_float32_rounding(calibration):
    """Weak when every coordinate's noise stays within 2^-23 with probability > τ."""
    r = 384
    b_star = laplace_boundary(r)
    eps_star = (r if calibration == "vector" else 1) / b_star
    assert weak_privacy_reason(Laplace(eps_star * 0.98, calibration), dim=r) is None
    why = weak_privacy_reason(Laplace(eps_star * 1.02, calibration), dim=r)
    assert why.startswith("laplace epsilon=") and "float32 rounding (2^-23)" in why
    for eps in (0.1, 1.0, 1e3, 1e6):  # the published range and far beyond it
        assert weak_privacy_reason(Laplace(eps, calibration), dim=r) is None
    assert "not finite" in weak_privacy_reason(Laplace(1e307, "coordinate"), dim=r)
    with pytest.raises(ValueError, match="pass the bundle"):
        weak_privacy_reason(Laplace(1.0))


def test_bit_mechanisms_floor():
    """Deterministic output (every bit a fixed function of its input bit with probability
    > 0.99) or a non-finite worst case is weak; the OME paper's setting is not."""
    assert weak_privacy_reason(OME(1.0, 100.0, 384)) is None  # Lyu et al. 2020 Table 1
    assert weak_privacy_reason(OME(1e3, 100.0, 8)) is None
    why = weak_privacy_reason(OME(1.0, 1e6, 384))  # keeps even bits, zeroes odd ones
    assert why.startswith("ome epsilon=1, lam=1e+06 is weaker than the privacy floor")
    assert "fixed function of the input bit" in why
    assert "not finite" in weak_privacy_reason(OME(1.0, 1e20, 384))  # p_even rounds to 1
    assert "not finite" in weak_privacy_reason(SUE(1e9, 16))
    assert weak_privacy_reason(SUE(10.0, 16)) is None
    assert "not finite" in weak_privacy_reason(OUE(1e9, 16))


def test_none_texthide_threshold_and_require():
    assert "no privatization" in weak_privacy_reason("none")
    assert weak_privacy_reason(TextHide(4, 1, 8, seed=0)) is None
    for bad in (0, 1, 1.5, "x"):
        with pytest.raises(ValueError, match="threshold"):
            weak_privacy_reason("none", threshold=bad)
    with pytest.raises(ValueError, match="unknown mechanism 'dchi'"):
        weak_privacy_reason("dchi")
    with pytest.raises(WeakPrivacyError, match="privacy floor") as exc:
        require_privacy_floor(OME(1.0, 1e6, 8))
    assert isinstance(exc.value, ValueError)
    assert "privacy floor" in require_privacy_floor(OME(1.0, 1e6, 8), allow_weak=True)
    assert require_privacy_floor(OME(1.0, 2.0, 8)) is None


def test_uncomputable_parameters_are_refused_by_name(tiny_bundle):
    b = tiny_bundle
    with pytest.raises(ValueError, match=r"^eta=1e-40 is too small to compute"):
        DChiText(b, 1e-40)
    with pytest.raises(ValueError, match=r"^eta=1e-40 .*overflows float32"):
        check_computable(DChiEmbedding(1e-40), b)
    with pytest.raises(ValueError, match="overflows a float16 payload"):
        check_computable(DChiEmbedding(1e-3), b, float_dtype="float16")
    check_computable(DChiEmbedding(1e-3), b)  # float32 carries it
    check_computable(DChiEmbedding(1e-2), b, float_dtype="float16")
    with pytest.raises(ValueError, match=r"^epsilon=1e-40 is too small to compute"):
        check_computable(Laplace(1e-40), dim=16)
    check_computable(Laplace(1e-30), dim=16)
    with pytest.raises(ValueError, match="eta=1e-40"):
        DChiEmbedding(1e-40).privatize(np.zeros((2, 16)))
    with pytest.raises(ValueError, match="1/eta overflows"):
        DChiEmbedding(5e-324).privatize(np.zeros((2, 16)))
    with pytest.raises(ValueError, match="too large for the float32"):
        ExactNearest(b.embeddings).search(np.full((1, b.dim), 1e37))
    with pytest.raises(ValueError, match=r"^m=1000000000000 is too large"):
        TextHide(10**12, 1, 384)


def test_every_eta_the_check_lets_through_is_searched():
    """check_dchi_eta and ExactNearest.search apply one overflow rule: the noisy queries of
    the smallest eta the check accepts are searched (the search once bounded a query's norm
    by max|y| sqrt(n), up to sqrt(n) times too large, and refused etas the check had let
    through: exit 1 after the work started, instead of exit 2 naming eta before it)."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(50, 384)).astype(np.float32)  # MiniLM's n: the gap was 3x
    t_max = float(np.linalg.norm(table, axis=1).max())
    lo, hi = 1e-60, 1.0
    while hi / lo > 1.0 + 1e-9:
        mid = math.sqrt(lo * hi)
        try:
            check_dchi_eta(mid, 384, t_max)
            hi = mid
        except ValueError:
            lo = mid
    queries = table.astype(np.float64) + sample_dchi_noise(50, 384, hi, rng)
    assert ExactNearest(table).search(queries).shape == (50,)
    with pytest.raises(ValueError, match="too small to compute"):
        check_dchi_eta(lo, 384, t_max)


def test_texthide_pool_drawn_in_chunks_is_the_pool_of_one_draw():
    m, dim = 300_000, 8  # three chunks
    pool = TextHide(m, 1, dim, seed=9).pool
    one = np.where(np.random.default_rng(9).random((m, dim)) < 0.5, -1, 1).astype(np.int8)
    np.testing.assert_array_equal(pool, one)
