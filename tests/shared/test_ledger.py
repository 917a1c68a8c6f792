"""shared.ledger: costs from mechanism, parameters and payload; composition; the filter.

Property tests (hypothesis) state their tolerance where floating point sums are compared:
a relative 1e-12 (a few ulps of sums of at most 50 terms)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import ledger
from shared.accounting import bundle_diameter, guarantee, sentence_epsilon
from shared.mechanisms import OME, OUE, SUE, DChiEmbedding, DChiText, Laplace, TextHide
from shared.payload import make_payload

REL = 1e-12
amount = st.floats(min_value=0, max_value=1e6, allow_nan=False)
eps_ = st.floats(min_value=1e-3, max_value=50, allow_nan=False)
BAD = [math.nan, -1.0, -1e-300, math.inf, -math.inf, True, "1", None]


# -- costs agree with the guarantee shared.accounting prints --------------------------------------
@given(eta=st.floats(min_value=0.5, max_value=500), n=st.integers(0, 512))
@settings(max_examples=40, deadline=None)
def test_dchi_cost_is_eta_n_d_and_matches_the_printed_guarantee(tiny_bundle, eta, n):
    d = bundle_diameter(tiny_bundle)
    for mech in (DChiText(tiny_bundle, eta), DChiEmbedding(eta)):
        c = ledger.mechanism_cost(mech, tokens=n, diameter=d)
        assert c.family == "dchi" and c.tokens == n and c.eta == eta
        assert c.metric == pytest.approx(eta * n, rel=REL)
        printed = sentence_epsilon(guarantee(mech, tiny_bundle, sample=50), n)
        assert c.epsilon == pytest.approx(printed, rel=REL, abs=0)


def test_bundle_diameter_is_twice_the_largest_regular_norm(tiny_bundle):
    reg = tiny_bundle.embeddings[tiny_bundle.regular_ids].astype(np.float64)
    assert bundle_diameter(tiny_bundle) == pytest.approx(
        2 * np.linalg.norm(reg, axis=1).max(), rel=1e-6)


@given(eps=eps_, r=st.integers(1, 2048), cal=st.sampled_from(["vector", "coordinate"]),
       mu=st.sampled_from([0.0, 0.1, 0.5]))
@settings(max_examples=40, deadline=None)
def test_laplace_cost_is_the_whole_vector_epsilon(eps, r, cal, mu):
    c = ledger.mechanism_cost(Laplace(eps, cal, mu), dim=r)
    assert c.family == "laplace"
    assert c.epsilon == pytest.approx(eps if cal == "vector" else r * eps, rel=REL)
    # word dropout lowers only the neighbouring-sentence figure: never the ledger's
    assert c.epsilon == pytest.approx(guarantee(Laplace(eps, cal, mu), dim=r)["worst_case"]
                                      ["epsilon"], rel=REL)


@given(eps=eps_, lam=st.floats(min_value=0.1, max_value=8), r=st.integers(1, 64))
@settings(max_examples=30, deadline=None)
def test_bit_costs_are_the_worst_case_not_the_nominal_epsilon(eps, lam, r):
    ome = OME(eps, lam, r)
    c = ledger.mechanism_cost(ome)
    assert c.family == "randomized-response"
    assert c.epsilon == pytest.approx(guarantee(ome)["worst_case"]["epsilon"], rel=REL)
    for mech in (SUE(eps, r), OUE(eps, r)):
        assert ledger.mechanism_cost(mech).epsilon == pytest.approx(
            guarantee(mech)["worst_case"]["epsilon"], rel=REL)


def test_texthide_and_none_count_sends_without_an_epsilon():
    for c in (ledger.mechanism_cost(TextHide(8, 2, 16, seed=1)), ledger.mechanism_cost("none")):
        assert c.epsilon is None and c.sends == 1
    s = ledger.compose([ledger.cost("texthide", {}), ledger.cost("texthide", {}),
                        ledger.cost("none", {})])
    assert (s.families["texthide"].sends, s.families["none"].sends, s.total) == (2, 1, 0.0)


def test_payload_cost_reads_the_payload_not_the_caller(tiny_bundle):
    d = bundle_diameter(tiny_bundle)
    ids = np.array([9, 10, 11, 12, 13], dtype=np.int32)
    p = make_payload("dchi-text", {"eta": 7.0}, tiny_bundle.bundle_id, ids, segments=[2, 3])
    assert ledger.payload_cost(p, d).tokens == 5
    assert ledger.payload_cost(p, d).epsilon == pytest.approx(7.0 * 5 * d, rel=REL)
    bits = np.zeros(12 * 10, dtype=np.uint8)
    o = make_payload("ome", {"epsilon": 1.0, "lam": 2.0}, tiny_bundle.bundle_id, bits)
    assert ledger.payload_size(o) == {"dim": 12}
    assert ledger.payload_cost(o).epsilon == pytest.approx(
        ledger.mechanism_cost(OME(1.0, 2.0, 12)).epsilon, rel=REL)
    v = make_payload("laplace", {"epsilon": 2.0, "calibration": "coordinate"},
                     tiny_bundle.bundle_id, np.zeros(24, dtype=np.float32))
    assert ledger.payload_cost(v).epsilon == pytest.approx(48.0, rel=REL)
    # a server passes its task's mechanism and parameters
    assert ledger.payload_cost(p, d, params={"eta": 1.0}).epsilon == pytest.approx(5 * d)


def test_a_cost_that_is_not_finite_cannot_be_counted(tiny_bundle):
    with pytest.raises(ValueError, match="not finite"):
        ledger.cost("laplace", {"epsilon": 1e308, "calibration": "coordinate"}, dim=10)
    with pytest.raises(ValueError, match="not finite"):
        ledger.cost("dchi-text", {"eta": 1e300}, tokens=10, diameter=1e10)
    with pytest.raises(ValueError, match="diameter"):
        ledger.cost("dchi-text", {"eta": 1.0}, tokens=3)
    for bad in BAD:
        with pytest.raises(ValueError):
            ledger.cost("dchi-text", {"eta": bad}, tokens=3, diameter=1.0)
        with pytest.raises(ValueError):
            ledger.Cost("laplace", bad)
    with pytest.raises(ValueError):
        ledger.cost("dchi-text", {"eta": 1.0}, tokens=-1, diameter=1.0)


# -- composition ---------------------------------------------------------------------------------
costs_ = st.lists(st.one_of(
    st.builds(lambda e, n: ledger.cost("dchi-text", {"eta": e}, tokens=n, diameter=2.5),
              eps_, st.integers(0, 64)),
    st.builds(lambda e: ledger.cost("laplace", {"epsilon": e}, dim=8), eps_),
    st.builds(lambda: ledger.cost("texthide", {}))), max_size=50)


@given(a=costs_, b=costs_)
@settings(max_examples=60, deadline=None)
def test_composition_sums_per_family_and_in_total(a, b):
    sa, sb, sab = ledger.compose(a), ledger.compose(b), ledger.compose(a + b)
    assert sab.total == pytest.approx(sa.total + sb.total, rel=REL, abs=1e-9)
    assert sab.sends == len(a) + len(b)
    assert ledger.compose(list(reversed(a + b))).total == pytest.approx(sab.total, rel=REL)
    for fam in ("dchi", "laplace"):
        want = math.fsum(c.epsilon for c in a + b if c.family == fam)
        got = sab.families.get(fam, ledger.FamilySpend()).epsilon
        assert got == pytest.approx(want, rel=REL, abs=1e-9)
    dchi = [c for c in a + b if c.family == "dchi"]
    if dchi:
        assert sab.families["dchi"].tokens == sum(c.tokens for c in dchi)
        assert ledger.total(dchi).epsilon == pytest.approx(
            math.fsum(c.epsilon for c in dchi), rel=REL)


# -- the filter ----------------------------------------------------------------------------------
@given(cap=amount, costs=st.lists(st.floats(min_value=0, max_value=1e5), max_size=60))
@settings(max_examples=200, deadline=None)
def test_the_filter_never_passes_its_cap_and_refuses_only_what_would(cap, costs):
    spent = 0.0
    for c in costs:
        if ledger.fits(spent, c, cap):
            spent += c
            assert spent <= cap
        else:
            assert cap == 0 or spent + c > cap
    assert spent <= cap
    assert ledger.remaining(spent, cap) == pytest.approx(cap - spent, abs=1e-9)


@given(spent=amount, c=amount, smaller=amount, cap=st.one_of(st.none(), amount))
def test_the_filter_is_monotone(spent, c, smaller, cap):
    if ledger.fits(spent, c, cap):
        assert ledger.fits(spent, min(c, smaller), cap)
    assert ledger.fits(spent, c, None)  # without a cap everything is counted, nothing refused


@given(spent=amount, c=st.one_of(st.none(), amount))
def test_a_cap_of_zero_refuses_everything(spent, c):
    assert not ledger.fits(spent, c, 0.0)
    assert not ledger.fits(spent, c, 0)
    assert ledger.remaining(spent, 0.0) == 0.0


def test_no_epsilon_fits_only_without_a_cap():
    assert ledger.fits(0.0, None, None)
    assert not ledger.fits(0.0, None, 1e9)


@pytest.mark.parametrize("bad", BAD[:-1])
def test_nan_negative_or_infinite_costs_and_caps_are_refused(bad):
    with pytest.raises(ValueError):
        ledger.fits(0.0, bad, 10.0)
    with pytest.raises(ValueError):
        ledger.fits(0.0, 1.0, bad)
    with pytest.raises(ValueError):
        ledger.fits(bad, 1.0, 10.0)
    with pytest.raises(ValueError):
        ledger.check_cap(bad)
    with pytest.raises(ValueError):
        ledger.remaining(0.0, bad)


@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
       eta=st.floats(min_value=0.5, max_value=500))
@settings(max_examples=30, deadline=None)
def test_batch_cost_is_the_sum_of_the_payload_costs(tiny_bundle, lengths, eta):
    d = bundle_diameter(tiny_bundle)
    ps = [make_payload("dchi-text", {"eta": eta}, tiny_bundle.bundle_id,
                       np.full(n, 9, dtype=np.int32)) for n in lengths]
    one_by_one = ledger.total(ledger.payload_cost(p, d) for p in ps)
    batch = ledger.batch_cost(ps, "dchi-text", {"eta": eta}, d)
    assert batch.epsilon == pytest.approx(one_by_one.epsilon, rel=REL)
    assert (batch.tokens, batch.sends) == (one_by_one.tokens, one_by_one.sends)
    vs = [make_payload("laplace", {"epsilon": 2.0, "calibration": "coordinate"},
                       tiny_bundle.bundle_id, np.zeros(n, dtype=np.float32)) for n in lengths]
    got = ledger.batch_cost(vs, "laplace", {"epsilon": 2.0, "calibration": "coordinate"})
    assert got.epsilon == pytest.approx(2.0 * sum(lengths), rel=REL) and got.sends == len(vs)
    assert ledger.batch_cost([], "laplace", {"epsilon": 1.0}) is None
