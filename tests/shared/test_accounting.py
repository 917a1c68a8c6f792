"""Accounting figures against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shared.accounting import bit_flip_epsilon, dchi_diameter_bound, guarantee, summary
from shared.bundle import EdgeBundle
from shared.mechanisms import OME, OUE, SUE, DChiEmbedding, DChiText, Laplace, TextHide


def test_ome_worst_case_by_hand():
    eps, lam, r = 1.0, 100.0, 384
    n = r * 10
    pe, po, q = lam / (1 + lam), 1 / (1 + lam**3), 1 / (1 + lam * math.exp(eps / n))

    def per_bit(p):
        return max(math.log(p / q), math.log(q / p), math.log((1 - p) / (1 - q)),
                   math.log((1 - q) / (1 - p)))

    expected = n / 2 * per_bit(pe) + n / 2 * per_bit(po)
    g = guarantee(OME(eps, lam, r))
    assert g["nominal"]["epsilon"] == eps
    assert g["worst_case"]["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert g["worst_case"]["epsilon"] > 20_000  # the published ε=1 does not hold
    assert f"epsilon = {expected:.1f}," in " ".join(g["notes"])  # the note states the number


def test_sue_and_oue_hold_their_nominal_epsilon():
    for mech in (SUE(2.0, 16), OUE(2.0, 16)):
        g = guarantee(mech)
        assert g["worst_case"]["epsilon"] <= 2.0 + 1e-12
    # SUE spends exactly ε: ln(p/q) = ε/n per bit
    assert guarantee(SUE(2.0, 16))["worst_case"]["epsilon"] == pytest.approx(2.0)


def test_bit_flip_epsilon_edge_cases():
    assert bit_flip_epsilon(np.array([0.5, 0.5]), 0.5) == 0
    assert bit_flip_epsilon(np.array([1.0]), 0.5) == math.inf  # deterministic bit


def test_laplace_coordinate_calibration_is_r_times_epsilon():
    g = guarantee(Laplace(0.5, "coordinate"), dim=768)
    assert g["nominal"]["epsilon"] == 0.5
    assert g["worst_case"]["epsilon"] == pytest.approx(384.0)
    gv = guarantee(Laplace(0.5, "vector"), dim=768)
    assert gv["worst_case"]["epsilon"] == pytest.approx(0.5)
    # with dropout μ: the published figure is ε' = ln((1-μ)e^ε + μ); it holds only between
    # sentences differing in one word, any two sentences keep the whole-vector ε
    gd = guarantee(Laplace(0.5, "coordinate", word_dropout=0.2), dim=4)
    assert gd["nominal"]["epsilon"] == pytest.approx(math.log(0.8 * math.exp(0.5) + 0.2))
    assert gd["worst_case"]["epsilon"] == pytest.approx(2.0)
    assert gd["worst_case"]["word_level_epsilon"] == pytest.approx(
        math.log(0.8 * math.exp(2.0) + 0.2))
    gvd = guarantee(Laplace(1.0, "vector", word_dropout=0.5), dim=4)
    assert gvd["worst_case"]["epsilon"] == pytest.approx(1.0)
    assert gvd["worst_case"]["word_level_epsilon"] == pytest.approx(
        math.log(0.5 * math.e + 0.5))
    assert "differ in one word" in " ".join(gvd["notes"])
    # no dimension known: no number invented
    assert guarantee(Laplace(0.5, "coordinate"))["worst_case"]["epsilon"] is None


def test_texthide_and_none():
    g = guarantee(TextHide(16, 4, 8, seed=0))
    assert g["nominal"]["epsilon"] is None and g["worst_case"]["epsilon"] is None
    assert "No differential-privacy guarantee" in g["notes"][0]
    assert "(16, 4)" in g["notes"][0]
    assert guarantee("none")["worst_case"]["epsilon"] == math.inf


def line_bundle(tmp_path) -> EdgeBundle:
    """A bundle whose regular tokens sit on a line at 0, 1, 3, 6, 10, ... (known distances)."""
    from tests.conftest import make_tiny_bert_dir

    d = make_tiny_bert_dir(tmp_path / "m", dim=4)
    b = EdgeBundle.from_model(d)
    emb = np.zeros_like(b.embeddings)
    pos = np.cumsum(np.arange(b.regular_ids.size, dtype=np.float32))
    emb[b.regular_ids, 0] = pos
    emb[[i for i in range(b.vocab_size) if i not in set(b.regular_ids)], 1] = 1000.0
    return EdgeBundle(b._tokenizer_json, emb, {k: v for k, v in b.meta.items()
                                               if k not in ("files", "bundle_id")})


def test_dchi_figures_on_a_known_geometry(tmp_path):
    b = line_bundle(tmp_path)  # 32 regular tokens at triangular numbers
    g = guarantee(DChiEmbedding(2.0), b, sample=10_000)
    wc = g["worst_case"]
    # nearest-neighbour distance of token j>0 is j (gap to the left); of token 0 it is 1.
    nn1 = np.array([1] + list(range(1, 32)), dtype=float)
    assert wc["neighbour_distance_median"]["1"] == pytest.approx(np.median(nn1))
    assert wc["epsilon_to_neighbour"]["1"] == pytest.approx(2.0 * np.median(nn1))
    assert wc["expected_noise_norm"] == pytest.approx(4 / 2.0)
    pos_max = 31 * 32 / 2
    assert wc["epsilon"] == pytest.approx(2.0 * 2 * pos_max)  # η × 2 max‖φ‖ over regular tokens
    assert g["nominal"]["eta"] == 2.0


def test_dchi_text_uses_its_bundle_and_summary_is_one_line(tiny_bundle):
    g = guarantee(DChiText(tiny_bundle, 10.0))
    assert "epsilon_to_neighbour" in g["worst_case"]
    line = summary(g)
    assert "\n" not in line and "eta=10" in line
    assert "epsilon_to_neighbour" not in guarantee(DChiEmbedding(10.0))["worst_case"]


def test_sentence_epsilon_sums_the_per_token_bound(tiny_bundle):
    from shared.accounting import sentence_epsilon

    g = guarantee(DChiText(tiny_bundle, 10.0))
    per_token = g["worst_case"]["epsilon"]
    assert sentence_epsilon(g, 12) == pytest.approx(12 * per_token)
    assert f"{12 * per_token:,.0f} for a sentence of 12.0 tokens" in summary(g, 12)
    lap = guarantee(Laplace(1.0, "vector"), dim=8)
    assert sentence_epsilon(lap, 12) == pytest.approx(1.0)  # already per sentence
    assert sentence_epsilon(guarantee(TextHide(4, 1, 8, seed=2**100)), 12) is None


# -- OME with λ < 1, where the ratios λ = 100 never needs decide the sum --------------
def ratios(p: float, q: float) -> dict[str, float]:
    """The four likelihood ratios of one randomized-response bit, by hand."""
    return {"p/q": p / q, "q/p": q / p, "(1-p)/(1-q)": (1 - p) / (1 - q),
            "(1-q)/(1-p)": (1 - q) / (1 - p)}


@pytest.mark.parametrize(("p", "q", "largest"), [(0.6, 0.1, "p/q"), (0.1, 0.6, "q/p"),
                                                 (0.5, 0.6, "(1-p)/(1-q)"),
                                                 (0.6, 0.5, "(1-q)/(1-p)")])
def test_bit_flip_epsilon_uses_each_of_the_four_ratios(p, q, largest):
    """Each case has a different ratio strictly largest: dropping any of the four from the
    per-bit maximum changes one of these sums."""
    r = ratios(p, q)
    assert max(r, key=r.get) == largest and sorted(r.values())[-2] < r[largest]
    assert bit_flip_epsilon(np.array([p, p, p]), q) == pytest.approx(3 * math.log(r[largest]),
                                                                      rel=1e-12)


@pytest.mark.parametrize(("eps", "lam", "dim"), [(1.0, 0.5, 3), (5.0, 0.2, 2), (2.0, 0.9, 4),
                                                 (0.1, 0.05, 1), (1.0, 100.0, 2)])
def test_ome_worst_case_by_hand_for_small_lambda(eps, lam, dim):
    """Σ over every bit of ln max(p_i/q, q/p_i, (1-p_i)/(1-q), (1-q)/(1-p_i)) with p_i and q
    of Eq. 2-3 computed here, position by position (i even: λ/(1+λ), odd: 1/(1+λ³))."""
    n = dim * 10
    q = 1 / (1 + lam * math.exp(eps / n))
    total, winners = 0.0, set()
    for i in range(n):
        p = lam / (1 + lam) if i % 2 == 0 else 1 / (1 + lam**3)
        r = ratios(p, q)
        total += math.log(max(r.values()))
        winners.add(max(r, key=r.get))
    g = guarantee(OME(eps, lam, dim))
    assert g["worst_case"]["epsilon"] == pytest.approx(total, rel=1e-12)
    if lam < 1:  # odd bits: p_i > q, and (1-q)/(1-p_i) is the largest (never at λ = 100)
        assert "(1-q)/(1-p)" in winners


@pytest.mark.parametrize(("eps", "lam"), [(1.0, 0.5), (5.0, 0.2), (2.0, 3.0), (1.0, 100.0)])
def test_bit_probabilities_match_flip_probabilities_position_by_position(eps, lam):
    """bit_probabilities()[i] is Pr[1 -> 1] of Eq. 2 at position i (0-based in the whole
    r·l vector): λ/(1+λ) at even i, 1/(1+λ³) at odd i; q of Eq. 3 for every bit. Swapping
    even and odd, or the parity of the first bit, fails here (λ ≠ 1)."""
    dim = 3
    ome = OME(eps, lam, dim)
    n = dim * 10
    p, q = ome.bit_probabilities()
    assert p.shape == (n,)
    expected = [lam / (1 + lam) if i % 2 == 0 else 1 / (1 + lam**3) for i in range(n)]
    np.testing.assert_allclose(p, expected, rtol=1e-12)
    assert q == pytest.approx(1 / (1 + lam * math.exp(eps / n)), rel=1e-12)
    p_even, p_odd, q2 = ome.flip_probabilities()
    assert (p_even, p_odd, q2) == pytest.approx((expected[0], expected[1], q), rel=1e-12)


def _exact_diameter(t: np.ndarray) -> float:
    t64 = np.asarray(t, dtype=np.float64)
    return 2.0 * math.sqrt(max(math.fsum((r * r).tolist()) for r in t64))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 12), st.integers(1, 40)),
                  elements=st.floats(-(2.0 ** 50), 2.0 ** 50, width=32)))
def test_the_diameter_is_the_correctly_rounded_one(t):
    # every row's norm² summed exactly (math.fsum of exact float64 squares), whatever the sums
    # in float32 or in order would say: both edges charge this D to the last bit
    assert dchi_diameter_bound(t) == _exact_diameter(t)


def test_the_diameter_picks_the_row_a_plain_sum_misses():
    t = np.zeros((2, 18), np.float32)
    t[0, 0], t[0, 1:17] = 1.0, 2.0 ** -27  # exact norm² 1 + 2^-50; in order: 1
    t[1, 0], t[1, 1:3] = 1.0, 2.0 ** -26   # exact norm² 1 + 2^-51; in order: the same
    assert dchi_diameter_bound(t) == 2.0 * math.sqrt(1.0 + 2.0 ** -50)
    assert dchi_diameter_bound(t, np.array([1])) == 2.0 * math.sqrt(1.0 + 2.0 ** -51)
    assert dchi_diameter_bound(t) > dchi_diameter_bound(t, np.array([1]))
    big = np.full((2, 3), 3e30, np.float32)  # float32 squares overflow: summed in float64
    assert dchi_diameter_bound(big) == _exact_diameter(big) < math.inf
    assert math.isnan(dchi_diameter_bound(np.array([[1.0, np.nan]], np.float32)))
    assert dchi_diameter_bound(np.zeros((0, 3), np.float32)) == 0.0


# two rows found by search (web_edge/test/slips.test.mjs has the same): numpy's float32 row
# sums rank them the wrong way (b above a), the exact sums put a above b (issue 42)
_A = [1024237508, 1028595262, 1058048601, 3213958987, 3210399718, 1064778842, 1049529228,
      3197298018, 3188097535, 1058856995, 1049320456, 3207852429, 3214476027, 1061458621,
      3214883585, 1073817606, 3214335321, 3206857298, 1065870338, 1068908352, 1027331581,
      3224116451, 3189117946, 3221719536]
_B = [x + 1 if i == 6 else x - 1 if i == 19 else x for i, x in enumerate(_A)]


def test_the_diameter_is_exact_where_float32_sums_rank_near_ties_the_wrong_way():
    t = np.array([_A, _B, [0x3F000000] * len(_A)], dtype=np.uint32).view(np.float32)
    exact = [math.fsum((r.astype(np.float64) ** 2).tolist()) for r in t]
    assert exact[0] > exact[1]
    assert exact == [28.72915101331762, 28.72915069045045, 6.0]
    assert dchi_diameter_bound(t) == 2.0 * math.sqrt(exact[0]) == _exact_diameter(t)
    assert dchi_diameter_bound(t, np.array([1, 2])) == 2.0 * math.sqrt(exact[1])
    assert dchi_diameter_bound(t[::-1].copy()) == 2.0 * math.sqrt(exact[0])
