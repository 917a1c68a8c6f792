"""The int8 candidate pass of ExactNearest: exact on adversarial near-ties,
duplicate rows and random data; its bound covers the kernel's real error and a bound
300 times smaller gives wrong ids; the kernel probe catches a saturating kernel; the
path is chosen by timing and falls back to float32 where it cannot run."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.mechanisms import int8_pass
from shared.mechanisms.nearest import AUTO_MIN_ROWS, ExactNearest, brute_force_nearest
from tests.shared.test_dchi import adversarial_near_ties, direct_nearest

pytest.importorskip("onnxruntime")


def shrink_int8_bound(index: ExactNearest, factor: float = 300.0) -> None:
    """Divide the int8 bound (steps 4-5 and the per-pair step 7) by ``factor``."""
    p = index._int8
    p.chunk_bias = lambda e, y, f=p.chunk_bias: f(e / factor, y / factor)
    p.pair_bound = lambda en, yn, rows, beta, f=p.pair_bound: f(en / factor, yn / factor,
                                                                rows, beta)


def test_int8_search_on_adversarial_near_ties_and_a_too_small_bound_fails():
    """Twins closer than int8 (and float32) can resolve, exact duplicates, midpoints:
    identical to the direct float64 search; the same pass with its bound shrunk 300
    times returns wrong ids on these queries."""
    wrong = 0
    for seed in range(3):
        table, queries = adversarial_near_ties(seed)
        expected = direct_nearest(table, queries)
        idx = ExactNearest(table, chunk=128, backend="int8")
        np.testing.assert_array_equal(idx.search(queries), expected)
        assert idx.last_fallback_count == 0 and idx.last_rerank_count >= 700  # float64 decided
        small = ExactNearest(table, chunk=128, backend="int8")
        shrink_int8_bound(small)
        wrong += int((small.search(queries) != expected).sum())
    assert wrong > 0


def test_int8_search_on_dchi_queries_and_a_too_small_bound_fails(minilm_bundle):
    """Noisy MiniLM embeddings at η = 65 (the bench's queries): equal to the float64
    brute force, most queries decided without a float64 re-rank; with the bound shrunk
    300 times, wrong ids."""
    b = minilm_bundle
    rng = np.random.default_rng(4)
    table = b.embeddings[b.regular_ids]
    ids = rng.choice(b.regular_ids, 1200)
    from shared.mechanisms.dchi import sample_dchi_noise

    queries = b.embeddings[ids].astype(np.float64) + sample_dchi_noise(ids.size, b.dim, 65.0, rng)
    expected = brute_force_nearest(table, queries)
    idx = ExactNearest(table, backend="int8")
    np.testing.assert_array_equal(idx.search(queries), expected)
    assert idx.kernel_info["int8"] in ("u8s8", "u8u8")
    assert idx.last_rerank_count < 0.05 * ids.size  # float32 tells most candidates apart
    assert idx.last_fallback_count < 0.05 * ids.size
    shrink_int8_bound(idx)
    assert (idx.search(queries) != expected).sum() > 10


def test_int8_bound_covers_the_kernel_error():
    """Step 4 of int8_pass on the kernel's own output: |s_j - o_j - δ_j| <= r_j(y) for
    every query and row, with s_j computed in float64."""
    rng = np.random.default_rng(2)
    table = (rng.normal(size=(3000, 96)) * rng.uniform(0.1, 3, size=(3000, 1))).astype(np.float32)
    queries = rng.normal(size=(64, 96)) * 2
    for signed in (True, False):
        p = int8_pass.Int8CandidatePass(table, signed=signed)
        a = float(int8_pass.f32_up(np.abs(queries).max() / 127))
        q = np.rint(queries / a)
        e = queries - q * a
        en, yn = np.linalg.norm(e, axis=1), np.linalg.norm(q * a, axis=1)
        beta32, delta, _, _ = p.chunk_bias(float(en.max()), float(yn.max()))
        scores, _ = p.buffers(64)
        p._run((q + 128).astype(np.uint8), a, beta32, scores)
        o = scores[:, : table.shape[0]].astype(np.float64)
        t64 = table.astype(np.float64)
        s = (t64 * t64).sum(1)[None, :] - 2 * queries @ t64.T
        rows = np.arange(table.shape[0])
        bound = np.stack([p.pair_bound(en[i], yn[i], rows, beta32) for i in range(64)])
        err = np.abs(s - o - delta[None, :])
        assert (err <= bound).all()
        assert err.max() > 0.01 * bound.max()  # the kernel's error is real, not zero


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 60), st.integers(1, 33), st.integers(0, 2**32 - 1), st.floats(0.01, 100))
def test_int8_search_property(rows, dim, seed, spread):
    """Any table (lattice points: many exact ties; duplicates; odd dims) and queries:
    equal to the brute force."""
    rng = np.random.default_rng(seed)
    table = np.round(rng.normal(size=(rows, dim)) * 4) / 4
    table = np.concatenate([table, table[: rows // 3]]).astype(np.float32)
    queries = np.concatenate([table[:5].astype(np.float64), rng.normal(size=(30, dim)) * spread])
    np.testing.assert_array_equal(ExactNearest(table, chunk=7, backend="int8").search(queries),
                                  brute_force_nearest(table, queries))


def test_duplicate_rows_beyond_the_cap_go_to_the_float32_pass():
    """A row repeated 400 times (more candidates than the cap of 256): those queries take
    the float32 pass and the lowest duplicate wins; 20 repeats stay in the int8 pass."""
    rng = np.random.default_rng(7)
    base = rng.normal(size=(500, 32)).astype(np.float32)
    table = np.concatenate([base, np.repeat(base[:1], 400, axis=0), np.repeat(base[1:2], 20, 0)])
    queries = np.concatenate([base[:2] + 1e-3 * rng.normal(size=(2, 32)),
                              rng.normal(size=(40, 32))])
    idx = ExactNearest(table, backend="int8")
    got = idx.search(queries)
    np.testing.assert_array_equal(got, brute_force_nearest(table, queries))
    assert got[0] == 0 and got[1] == 1
    assert idx.last_fallback_count >= 1


def test_tiny_zero_and_huge_queries():
    """All-zero queries, queries too small for the kernel's float32 multiplier (the
    chunk takes the float32 pass), a zero table row; NaN/inf and overflowing queries
    refused as by the float32 pass."""
    rng = np.random.default_rng(3)
    table = rng.normal(size=(300, 16)).astype(np.float32)
    table[5] = 0
    idx = ExactNearest(table, backend="int8")
    for q in (np.zeros((3, 16)), rng.normal(size=(9, 16)) * 1e-35, rng.normal(size=(9, 16)) * 1e-300):
        np.testing.assert_array_equal(idx.search(q), brute_force_nearest(table, q))
    for bad in (np.full((1, 16), np.nan), np.full((1, 16), np.inf)):
        with pytest.raises(ValueError, match="NaN or Inf"):
            idx.search(bad)
    with pytest.raises(ValueError, match="overflow"):
        idx.search(np.full((1, 16), 1e37))


def test_the_probe_catches_a_saturating_kernel():
    """On x86 without VNNI, MLAS's u8·s8 kernel sums adjacent products in int16 with
    saturation: a full-range s8 table (pairs of 127) comes back wrong, which is what the
    probe refuses; the pair-bounded table of step 2 comes back exact."""
    flags = int8_pass.cpu_flags()
    dim = 64
    q_full = np.full((4, dim), 127.0)
    sess = int8_pass._session(int8_pass._model(q_full, np.full(4, 2.0**-7), True), 1)
    out = sess.run(None, {"A": np.full((2, dim), 255, np.uint8),
                          "a_scale": np.array(2.0**-7, np.float32),
                          "bias": np.zeros(4, np.float32)})[0]
    exact = 127.0 * 127.0 * dim * 2.0**-14
    if "avx2" in flags and not flags & int8_pass.VNNI_FLAGS:
        assert (out != exact).all()  # saturated: the hazard the probe exists for
    assert int8_pass.integer_gemm_is_exact(True, dim)
    assert int8_pass.integer_gemm_is_exact(False, dim)
    _, q = int8_pass.quantize_table(np.random.default_rng(0).normal(size=(100, 33)), True)
    qa = np.abs(q.astype(np.int16))
    assert (qa[:, 0:32:2] + qa[:, 1:32:2]).max() <= 128 and qa.max() <= 127


def test_onnx_graph_is_a_valid_model():
    """The hand-written protobuf is what onnx reads: checker, op, initializers."""
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    q = np.random.default_rng(0).integers(-127, 128, size=(50, 7)).astype(np.int8)
    for signed in (True, False):
        m = onnx.load_from_string(int8_pass._model(q, np.full(50, 0.5), signed))
        onnx.checker.check_model(m)
        assert m.graph.node[0].op_type == "MatMulIntegerToFloat"
        inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        expect = q.T if signed else q.T.astype(np.int16) + 128
        np.testing.assert_array_equal(inits["B"].astype(np.int16), expect)
        np.testing.assert_array_equal(inits["b_scale"], np.full(50, 0.5, np.float32))


def test_auto_picks_a_path_by_timing_and_stays_exact():
    """A large table: the first search of 8 chunks or more builds the int8 pass and
    times both passes on real chunks; either way the ids are the brute force's. A small
    table never builds it."""
    rng = np.random.default_rng(11)
    table = rng.normal(size=(AUTO_MIN_ROWS, 48)).astype(np.float32)
    queries = table[rng.integers(0, AUTO_MIN_ROWS, 1500)] + rng.normal(size=(1500, 48)) * 0.5
    idx = ExactNearest(table, chunk=64)
    np.testing.assert_array_equal(idx.search(queries), brute_force_nearest(table, queries))
    assert idx.backend in ("int8", "fp32")
    assert set(idx.kernel_info["probe_s"]) == {"int8", "fp32"}
    small = ExactNearest(table[:500])
    small.search(queries[:600])
    assert small.backend == "fp32" and small._int8 is None


def test_without_onnxruntime_the_float32_pass_runs(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    rng = np.random.default_rng(1)
    table = rng.normal(size=(AUTO_MIN_ROWS, 8)).astype(np.float32)
    queries = rng.normal(size=(600, 8))
    idx = ExactNearest(table, chunk=64)
    np.testing.assert_array_equal(idx.search(queries), brute_force_nearest(table, queries))
    assert idx.backend == "fp32" and "not installed" in idx.kernel_info["int8"]
    with pytest.raises(RuntimeError, match="cannot run"):
        ExactNearest(table, backend="int8")
    with pytest.raises(RuntimeError, match="cannot run"):
        ExactNearest(np.zeros((2, int8_pass.MAX_DIM + 1), np.float32), backend="int8")
    with pytest.raises(ValueError, match="backend"):
        ExactNearest(table, backend="bf16")
