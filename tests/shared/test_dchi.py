"""dχ noise and DChiEmbedding / DChiText.

Statistical tests use fixed seeds and a significance level of 1e-3: a correct
sampler passes deterministically, and a wrong one (per-coordinate noise) is
rejected with p-values many orders of magnitude below it — shown by
``test_per_coordinate_sampler_fails_the_radius_test``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from shared.mechanisms import DChiEmbedding, DChiText, sample_dchi_noise
from shared.mechanisms.nearest import ExactNearest, brute_force_nearest, gemm_nearest

ALPHA = 1e-3


def radius_pvalue(noise: np.ndarray, eta: float) -> float:
    """KS test of ||N|| against Gamma(shape=n, scale=1/eta)."""
    n = noise.shape[1]
    return stats.kstest(np.linalg.norm(noise, axis=1), stats.gamma(a=n, scale=1 / eta).cdf).pvalue


def direction_pvalues(noise: np.ndarray, axes: int = 3, seed: int = 1) -> list[float]:
    """KS tests of u·a for fixed unit axes a: (u·a + 1)/2 ~ Beta((n-1)/2, (n-1)/2) if u is uniform."""
    n = noise.shape[1]
    u = noise / np.linalg.norm(noise, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(axes):
        a = rng.standard_normal(n)
        a /= np.linalg.norm(a)
        out.append(stats.kstest((u @ a + 1) / 2, stats.beta((n - 1) / 2, (n - 1) / 2).cdf).pvalue)
    # also along a coordinate axis, where per-coordinate samplers differ most
    out.append(stats.kstest((u[:, 0] + 1) / 2, stats.beta((n - 1) / 2, (n - 1) / 2).cdf).pvalue)
    return out


@pytest.mark.parametrize(("dim", "eta"), [(2, 1.0), (16, 10.0), (384, 65.0), (768, 100.0)])
def test_radius_is_gamma_and_direction_uniform(dim, eta):
    noise = sample_dchi_noise(20_000, dim, eta, np.random.default_rng(dim))
    assert noise.shape == (20_000, dim)
    assert radius_pvalue(noise, eta) > ALPHA
    assert min(direction_pvalues(noise)) > ALPHA
    # mean norm n/eta (Qu et al. §5.2), within 1% at this sample size
    assert np.linalg.norm(noise, axis=1).mean() == pytest.approx(dim / eta, rel=0.01)


def per_coordinate_laplace(count, dim, eta, rng):
    """The wrong sampler: i.i.d. Laplace(1/eta) per coordinate."""
    return rng.laplace(0, 1 / eta, (count, dim))


def per_coordinate_gauss_matched(count, dim, eta, rng):
    """Another wrong one: Gaussian per coordinate scaled to the right mean norm n/eta."""
    return rng.standard_normal((count, dim)) * (dim / eta) / np.sqrt(dim)


@pytest.mark.parametrize("wrong", [per_coordinate_laplace, per_coordinate_gauss_matched])
def test_per_coordinate_sampler_fails_the_radius_test(wrong):
    noise = wrong(20_000, 384, 65.0, np.random.default_rng(0))
    assert radius_pvalue(noise, 65.0) < 1e-12


def test_uniform_direction_test_rejects_a_skewed_direction():
    rng = np.random.default_rng(0)
    noise = sample_dchi_noise(20_000, 16, 10.0, rng)
    noise[:, 0] = np.abs(noise[:, 0])  # fold half the sphere
    assert min(direction_pvalues(noise)) < 1e-12


def test_seeded_generator_reproduces_and_none_draws_fresh_entropy():
    a = sample_dchi_noise(4, 8, 5.0, np.random.default_rng(7))
    b = sample_dchi_noise(4, 8, 5.0, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    c, d = sample_dchi_noise(4, 8, 5.0), sample_dchi_noise(4, 8, 5.0)
    assert not np.array_equal(c, d)
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        sample_dchi_noise(4, 8, 5.0, 7)


@pytest.mark.parametrize("eta", [0, -1, float("nan"), float("inf"), "x"])
def test_eta_out_of_range(eta, tiny_bundle):
    for make in (lambda: DChiEmbedding(eta), lambda: DChiText(tiny_bundle, eta),
                 lambda: sample_dchi_noise(3, 4, eta)):
        with pytest.raises(ValueError, match="eta must be a finite number > 0"):
            make()


def test_dchi_embedding_adds_exactly_the_sampled_noise():
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    out = DChiEmbedding(3.0).privatize(x, np.random.default_rng(1))
    noise = sample_dchi_noise(5, 8, 3.0, np.random.default_rng(1))
    np.testing.assert_allclose(out, (x + noise).astype(np.float32), rtol=0, atol=1e-6)
    assert out.dtype == np.float32
    bad = x.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf"):
        DChiEmbedding(3.0).privatize(bad)
    with pytest.raises(ValueError, match="dimension"):
        DChiEmbedding(3.0).privatize(x[0])


@pytest.mark.parametrize("eta", [30.0, 65.0, 98.0, 200.0])
def test_dchi_text_is_the_exact_nearest_regular_token(minilm_bundle, eta):
    b = minilm_bundle
    ids = np.random.default_rng(3).choice(b.regular_ids, 400)
    mech = DChiText(b, eta)
    out = mech.privatize_ids(ids, np.random.default_rng(11))
    noisy = mech.noisy_embeddings(ids, np.random.default_rng(11))
    table = b.embeddings[b.regular_ids]
    expected = b.regular_ids[brute_force_nearest(table, noisy)]
    np.testing.assert_array_equal(out, expected)
    assert np.isin(out, b.regular_ids).all()


def test_dchi_text_output_is_always_regular(minilm_bundle):
    b = minilm_bundle
    specials = np.array(sorted(b.special_ids.values()) + b.meta["unused_ids"][:50])
    ids = np.concatenate([np.repeat(specials, 20), np.random.default_rng(0).choice(b.regular_ids, 2000)])
    for eta in (5.0, 50.0, 1000.0):  # from pure noise to almost no noise
        out = DChiText(b, eta).privatize_ids(ids, np.random.default_rng(1))
        assert np.isin(out, b.regular_ids).all()


def test_dchi_text_never_returns_a_special_token_even_when_it_is_nearest(tiny_bundle):
    b = tiny_bundle
    pad = b.special_ids["pad"]
    mech = DChiText(b, 1e6)  # noise ~1e-5: the input itself is nearest
    out = mech.privatize_ids(np.full(50, pad), np.random.default_rng(0))
    assert np.isin(out, b.regular_ids).all()
    table = b.embeddings[b.regular_ids]
    assert (out == b.regular_ids[brute_force_nearest(table, b.embeddings[[pad]])][0]).all()


def test_dchi_text_rejects_ids_outside_the_vocabulary(tiny_bundle):
    mech = DChiText(tiny_bundle, 10.0)
    for bad in ([0, tiny_bundle.vocab_size], [-1], [[1, 2]], [1.5]):
        with pytest.raises(ValueError, match="vocabulary|1-D|integers"):
            mech.privatize_ids(np.array(bad))
    assert mech.privatize_ids(np.array([], dtype=np.int64)).shape == (0,)


def test_exact_search_breaks_near_ties_correctly():
    """Rows closer than float32 can resolve, and exact duplicates: float64 re-rank decides."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(200, 32)).astype(np.float32)
    table = np.concatenate([base, base[:20]])  # duplicates: ties go to the lower index
    queries = np.concatenate([base[:20] + 1e-4 * rng.normal(size=(20, 32)),
                              rng.normal(size=(300, 32)) * 3])
    # Queries almost equidistant from two rows.
    mid = (base[50:70] + base[70:90]) / 2
    queries = np.concatenate([queries, mid.astype(np.float64) + 1e-9])
    idx = ExactNearest(table, chunk=64)
    got = idx.search(queries)
    np.testing.assert_array_equal(got, brute_force_nearest(table, queries))
    assert idx.last_rerank_count > 0  # the re-rank path was exercised


def test_exact_search_agrees_with_gemm_baseline_on_random_data():
    rng = np.random.default_rng(5)
    table = rng.normal(size=(1000, 24)).astype(np.float32)
    queries = rng.normal(size=(700, 24)) * 2
    np.testing.assert_array_equal(ExactNearest(table, chunk=100).search(queries),
                                  brute_force_nearest(table, queries))
    # The float32 baseline agrees except in near-ties, which random data does not have.
    np.testing.assert_array_equal(gemm_nearest(table, queries), brute_force_nearest(table, queries))


def test_score_bound_covers_the_float32_error():
    rng = np.random.default_rng(9)
    table = rng.normal(size=(500, 384)).astype(np.float32)
    queries = rng.normal(size=(200, 384)) * 4
    idx = ExactNearest(table)
    t64 = table.astype(np.float64)
    real = (t64 * t64).sum(1)[None, :] - 2 * queries @ t64.T
    y_aug = np.zeros((200, idx._width), np.float32)
    y_aug[:, :384] = queries
    y_aug[:, 384] = 1
    f32 = (y_aug @ idx._aug.T).astype(np.float64)
    bound = idx.score_bound(np.linalg.norm(queries, axis=1))
    assert (np.abs(f32 - real) <= bound[:, None]).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(1, 40), st.integers(0, 2**32 - 1), st.floats(0.01, 100))
def test_exact_search_property(rows, dim, seed, spread):
    """For any table and queries (duplicates and lattice points included), equal to brute force."""
    rng = np.random.default_rng(seed)
    table = np.round(rng.normal(size=(rows, dim)) * 4) / 4  # lattice: many exact ties
    table = np.concatenate([table, table[: rows // 3]]).astype(np.float32)
    queries = np.concatenate([table[:5].astype(np.float64), rng.normal(size=(30, dim)) * spread])
    np.testing.assert_array_equal(ExactNearest(table, chunk=7).search(queries),
                                  brute_force_nearest(table, queries))


# -- tests that notice plausible one-line mistakes ----------------------------------
def test_dchi_text_draws_its_own_gamma_noise_for_every_token(minilm_bundle):
    """noisy_embeddings(ids) - embeddings[ids]: radius ~ Gamma(n, 1/η) and uniform direction
    token by token, the same token repeated included. One vector drawn for a whole call
    (or per distinct token) gives identical radii: the KS test rejects it (p ~ 0)."""
    b, eta = minilm_bundle, 65.0
    rng = np.random.default_rng(21)
    ids = np.concatenate([np.full(3000, b.regular_ids[500]), rng.choice(b.regular_ids, 3000)])
    mech = DChiText(b, eta)
    noise = mech.noisy_embeddings(ids, rng) - b.embeddings[ids].astype(np.float64)
    assert radius_pvalue(noise, eta) > ALPHA
    assert min(direction_pvalues(noise)) > ALPHA
    assert np.unique(np.linalg.norm(noise, axis=1)).size == ids.size  # no vector reused
    # the test has teeth: one noise vector for the call fails it
    shared = np.repeat(noise[:1], ids.size, axis=0)
    assert radius_pvalue(shared, eta) < 1e-12


def test_score_bound_formula_is_pinned():
    """4 γ_{w+4} (2 ||y|| t_max + t_max²), γ_k = k u / (1 - k u), u = 2^-24, w = the table
    width n+1 padded to a multiple of 16 (nearest.py, step 2). Random data cannot tell a
    far too small bound from the right one; the formula can."""
    rng = np.random.default_rng(3)
    u = 2.0**-24
    for dim in (1, 15, 16, 17, 384, 768):
        table = (rng.normal(size=(40, dim)) * 3).astype(np.float32)
        idx = ExactNearest(table)
        width = -(-(dim + 1) // 16) * 16
        k = width + 4
        gamma = k * u / (1 - k * u)
        t = np.sqrt((table.astype(np.float64) ** 2).sum(axis=1).max())
        norms = np.array([0.0, 1.0, 123.456, 1e6])
        np.testing.assert_allclose(idx.score_bound(norms),
                                   4 * gamma * (2 * norms * t + t * t), rtol=1e-12)


def direct_nearest(table: np.ndarray, queries: np.ndarray, chunk: int = 256) -> np.ndarray:
    """argmin of ||t - y||² in float64, direct form, lowest index on ties: exact for the
    near-tie queries below (midpoints of float32 rows are exact in float64)."""
    t = table.astype(np.float64)
    out = np.empty(len(queries), dtype=np.int64)
    for s in range(0, len(queries), chunk):
        d = ((t[None, :, :] - queries[s : s + chunk, None, :]) ** 2).sum(axis=-1)
        out[s : s + chunk] = d.argmin(axis=1)
    return out


def adversarial_near_ties(seed: int, dim: int = 64, rows: int = 100, scale: float = 1e3):
    """Rows of norm ~1e3 with twins 1e-5 away (closer than float32 scores can tell apart),
    exact duplicates, and queries at and just off the midpoints of twins and of unrelated
    rows, and on duplicated rows (a tie the lower index wins)."""
    rng = np.random.default_rng(seed)
    base = (rng.normal(size=(rows, dim)) * scale / np.sqrt(dim)).astype(np.float32)
    twins = (base + rng.normal(size=(rows, dim)) * scale * 1e-5 / np.sqrt(dim)).astype(
        np.float32)
    table = np.concatenate([base, twins, base[:10]])
    a, b = base.astype(np.float64), twins.astype(np.float64)
    mid, d = (a + b) / 2, b - a
    other = np.roll(a, 1, axis=0)
    queries = [mid] + [mid + s * d for s in (1e-1, -1e-1, 1e-2, -1e-2, 1e-3, -1e-3)]
    queries += [(a + other) / 2, (a + other) / 2 + 1e-6 * (other - a), a[:10]]
    return table, np.concatenate(queries)


def test_exact_search_on_adversarial_near_ties_and_a_too_small_bound_fails():
    """With its bound the search returns the exact nearest id on every adversarial query;
    the same search with the bound 300 times smaller returns wrong ids there (so a bound
    shrunk by hundreds does not pass this test)."""
    wrong_with_small_bound = 0
    for seed in range(3):
        table, queries = adversarial_near_ties(seed)
        expected = direct_nearest(table, queries)
        idx = ExactNearest(table, chunk=128)
        np.testing.assert_array_equal(idx.search(queries), expected)
        assert idx.last_rerank_count >= 700  # the near ties went to the float64 re-rank
        small = ExactNearest(table, chunk=128)
        small.score_bound = lambda norms, full=small.score_bound: full(norms) / 300
        wrong_with_small_bound += int((small.search(queries) != expected).sum())
    assert wrong_with_small_bound > 0
