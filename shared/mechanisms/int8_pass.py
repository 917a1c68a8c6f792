"""Int8 candidate pass of the exact nearest-row search, with a proven bound.

``shared.mechanisms.nearest.ExactNearest`` runs it where it is faster than its float32
pass: one integer GEMM per chunk of queries through onnxruntime's
``MatMulIntegerToFloat`` (MLAS kernels: AVX2 ``vpmaddubsw``, AVX-VNNI / AVX512-VNNI
``vpdpbusd``, ARM ``sdot``/``udot``), whose scores come out as floats already shifted
by a per-row bias; a threshold that provably keeps the true nearest row; then the few
candidates are re-ranked, in float32 with its own bound and in float64 where that is
not enough. Which integer kernel runs is not assumed: :func:`integer_gemm_is_exact`
runs the graph once on extreme operands and the pass is refused where it is not exact.

Why the true nearest row is a candidate
---------------------------------------
Notation: t_j the float32 table rows, n_j = ||t_j||², u = 2^-24 (float32 unit
roundoff), γ_k = k u / (1 - k u) (Higham, *Accuracy and Stability of Numerical
Algorithms*, §3.1). For a query y the nearest row minimizes s_j = n_j - 2 y·t_j,
since ||y - t_j||² = ||y||² + s_j.

1. Quantization. Once per table: a step b_j > 0 (a float32, 1 for a zero row),
   integers Q_j = round(t_j / b_j), t̂_j = b_j Q_j, f_j = t_j - t̂_j. Once per chunk of
   queries: a = max |y| / 127 over the chunk rounded up to float32, q = round(y / a)
   in [-127, 127], ŷ = a q, e = y - ŷ. Only e and f enter the bound, so how the
   rounding is done does not matter.
2. The integer GEMM. The kernel gets A = q + 128 in [1, 255] (u8) and B = Q (s8, zero
   point 0) or Q + 128 (u8, zero point 128) and must return D_j = q·Q_j exactly.
   |D_j| ≤ 127² d < 2^24 for d ≤ 1040 (checked), so int32 holds it and it converts to
   float32 exactly. MLAS's u8·s8 kernel without VNNI sums the products of two
   adjacent coordinates in int16 with saturation (``vpmaddubsw``): the s8 table is
   quantized with b_j = max_k (|t_j,2k| + |t_j,2k+1|) / 127 rounded up, so that
   |Q_j,2k| + |Q_j,2k+1| ≤ 128 and every such pair sum is at most 255·128 < 2^15
   (a u8 table has b_j = max |t_j| / 127, its kernels widen to int16 first). The probe
   :func:`integer_gemm_is_exact` checks the extremes, including operands that a kernel
   pairing other coordinates would saturate; a failed probe means no int8 pass.
3. The kernel returns o_j = fl(fl(D_j c_j) + β_j) with c_j = fl(a · (-2 b_j)) and the
   float32 bias β_j: at most 4 roundings, so
   |o_j - (β_j - 2 a b_j D_j)| ≤ γ_4 (2 |ŷ·t̂_j| + |β_j|) ≤ γ_4 (2 ||ŷ|| ||t̂_j|| + |β_j|)
   (no underflow: a · min_j b_j ≥ 2^-100, else the chunk takes the float32 path).
4. y·t_j = ŷ·t̂_j + e·t_j + ŷ·f_j and a b_j D_j = ŷ·t̂_j, so with δ_j = n_j - β_j
   s_j = o_j + δ_j + ε_j,  |ε_j| ≤ r_j(y) = 2 ||e|| ||t_j|| + 2 ||ŷ|| ||f_j|| + γ_4 (2 ||ŷ|| ||t̂_j|| + |β_j|)
   (Cauchy-Schwarz on e·t_j and ŷ·f_j). With E ≥ ||e|| and Ŷ ≥ ||ŷ|| over the chunk,
   r_j(y) ≤ R_j = 2 E ||t_j|| + 2 Ŷ ||f_j|| + γ_4 (2 Ŷ ||t̂_j|| + |β_j|).
5. Threshold. Let k = argmin_j o_j and U = o_k + δ_k + r_k(y) ≥ s_k ≥ min_j s_j.
   A nearest row j has s_j = min s ≤ U and s_j ≥ o_j + δ_j - R_j ≥ o_j - M, with
   M = max_j (R_j - δ_j). So o_j ≤ U + M: every row with o_j ≤ U + M is a candidate,
   and the nearest rows (all of them, in a tie) are among the candidates. The bias
   β_j = fl32(n_j - R_j) (any β is correct) shifts each row by its own bound, which
   makes M ≈ 0 and the window about 2 R instead of twice the largest R_j.
6. Rounding of the bound itself: U + M is evaluated in float64 from norms computed in
   float64, every term with a relative error below (d + 8) 2^-53 < 2^-42; the slack
   η = 2^-36 (|o_k| + r_k + 2 max n + 2 max |β| + max R) covers them, and the float32
   threshold is fl32(U + M + η) moved one ulp up, so the float32 comparison o_j ≤ thr
   loses no candidate.
7. Re-rank. For each candidate the same argument with the query's own r_j(y) gives
   s_j ∈ [o_j + δ_j - r_j(y), o_j + δ_j + r_j(y)]; a candidate whose lower end exceeds
   the smallest upper end among the query's candidates is dropped. Then float32: with
   y' = fl32(y) and the dot product y'·t_j summed in float32 in any order,
   |fl(y'·t_j) - y·t_j| ≤ (γ_d ||y'|| + u ||y||) ||t_j|| (Higham §3.1, plus the
   rounding of y), which drops the same way every candidate that float32 can tell
   apart. What is left (a near tie) is decided by ||y - t_j||² in float64, ties to
   the lowest row, as in the float32 path. A query with more than ``cap`` candidates
   after step 5 takes the float32 path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shared.mechanisms.onnx_graph import one_node_model, value_info

if TYPE_CHECKING:
    import onnxruntime as ort  # no type information: its names read as Any

MAX_DIM = 1040  # 127^2 * 1040 < 2^24: the integer scores are exact in int32 and float32
U = 2.0**-24
GAMMA4 = 4 * U / (1 - 4 * U)
SLACK = 2.0**-36
TINY = 2.0**-100  # smallest a * b_j: no float32 underflow in the kernel's multiplier
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
BLOCK = 16  # rows j ≡ c (mod V/16) share a block: one strided min pass finds the best
PAD_BIAS = 1e38  # score of the padding rows (zero integers): never a candidate


def cpu_flags() -> set[str]:
    """The CPU feature flags the kernel reports (Linux /proc/cpuinfo); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def f32_up(x: np.ndarray | float) -> np.ndarray:
    """The smallest float32 >= x (as float64), elementwise."""
    x = np.asarray(x, dtype=np.float64)
    r = x.astype(np.float32)
    r = np.where(r.astype(np.float64) < x, np.nextafter(r, np.float32(np.inf)), r)
    return r.astype(np.float64)


def quantize_table(t: np.ndarray, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """(step b_j per row, float32-exact, as float64; integers Q as int8) by step 2: for an
    s8 table the sums of |Q| over adjacent coordinates (2k, 2k+1) are at most 128.
    Float32 arithmetic: |t / b| <= 127 up to a few ulps, so round() stays within 127
    and a pair within 128; checked after."""
    a = np.abs(np.asarray(t, dtype=np.float32))
    if signed:
        if a.shape[1] % 2:
            a = np.concatenate([a, np.zeros((a.shape[0], 1), np.float32)], axis=1)
        top = (a[:, 0::2] + a[:, 1::2]).max(axis=1)
    else:
        top = a.max(axis=1)
    b = f32_up(top.astype(np.float64) * (1 + 2.0**-20) / 127.0)  # covers the float32 sums
    b[b == 0] = 1.0  # a zero row quantizes to 0
    q = np.rint(np.asarray(t, dtype=np.float32) / b[:, None].astype(np.float32))
    q = np.clip(q, -127, 127, out=q).astype(np.int8)
    if signed:
        qa = np.abs(q.astype(np.int16))
        if qa.shape[1] > 1 and int((qa[:, 0 : qa.shape[1] - 1 : 2] + qa[:, 1::2]).max()) > 128:
            raise AssertionError("an s8 pair sum exceeds 128")  # step 2 rules it out
    return b, q


def _session(model: bytes, threads: int) -> ort.InferenceSession:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _model(q: np.ndarray, b_scale: np.ndarray, signed: bool) -> bytes:
    """O = MatMulIntegerToFloat(A u8 (m, d), B (d, V), a_scale, b_scale, 128, zp, bias)
    for table integers ``q`` (V, d) in [-127, 127]."""
    v, d = q.shape
    if signed:
        b_op, zp_b = q.T.astype(np.int8), np.array(0, np.int8)
    else:
        b_op, zp_b = (q.T.astype(np.int16) + 128).astype(np.uint8), np.array(128, np.uint8)
    return one_node_model(
        "MatMulIntegerToFloat", "com.microsoft",
        ["A", "B", "a_scale", "b_scale", "a_zp", "b_zp", "bias"], ["O"],
        [value_info("A", np.uint8, ("m", d)), value_info("a_scale", np.float32, ()),
         value_info("bias", np.float32, (v,))],
        [value_info("O", np.float32, ("m", v))],
        {"B": np.ascontiguousarray(b_op), "b_scale": b_scale.astype(np.float32),
         "a_zp": np.array(128, np.uint8), "b_zp": zp_b},
        {"": 13, "com.microsoft": 1})


def probe_operands(signed: bool, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(query integers (33, dim), table integers (70, dim)) at the extremes of step 2.
    The s8 rows alternate ±127 and ±1 on adjacent coordinates (pair sums 128): a kernel
    that paired coordinates 2k with 2k+2 instead would saturate on them."""
    rng = np.random.default_rng(0)
    qa = rng.choice([-127.0, 127.0], size=(33, dim))
    qa[0], qa[1] = 127.0, -127.0
    rows = [np.full(dim, 127.0), np.full(dim, -127.0)]
    if signed:
        alt = np.where(np.arange(dim) % 2 == 0, 127.0, 1.0)
        rows = [alt, -alt, alt[::-1].copy(), -alt[::-1]]
    qb = np.concatenate([np.array(rows), rng.integers(-127, 128, size=(70 - len(rows), dim))])
    if signed:  # random rows brought under the pair constraint
        qb = np.concatenate([np.array(rows), quantize_table(qb, True)[1][len(rows):]])
    return qa, qb.astype(np.float64)


def integer_gemm_is_exact(signed: bool, dim: int) -> bool:
    """Whether MatMulIntegerToFloat on this machine returns the exact integer products
    for the extreme operands of step 2 (a saturating kernel gets them wrong by
    thousands), for a chunk of queries and for a single one."""
    qa, qb = probe_operands(signed, dim)
    sess = _session(_model(qb, np.full(qb.shape[0], 2.0**-7), signed), 1)
    for a in (qa, qa[:1]):
        out = sess.run(None, {"A": (a + 128).astype(np.uint8),
                              "a_scale": np.array(2.0**-7, np.float32),
                              "bias": np.zeros(qb.shape[0], np.float32)})[0]
        if not np.array_equal(out.astype(np.float64), (a @ qb.T) * 2.0**-14):
            return False
    return True


class Int8CandidatePass:
    """Candidates for the exact nearest row of the float32 ``t32``, proven by the bound
    of the module docstring. ``signed``: s8 table operand (MLAS's faster kernels) or u8."""

    def __init__(self, t32: np.ndarray, signed: bool = True, cap: int = 256):
        if t32.shape[1] > MAX_DIM:
            raise ValueError(f"the int8 pass needs dim <= {MAX_DIM}, got {t32.shape[1]}")
        self.t32 = t32
        self.dim = t32.shape[1]
        v = t32.shape[0]
        self.n, self.that_n, self.fn = np.empty(v), np.empty(v), np.empty(v)
        b, q = np.empty(v), np.empty((v, self.dim), dtype=np.int8)
        for s in range(0, v, 2048):  # blocks of rows: the float64 work stays in cache
            t = t32[s : s + 2048]
            b[s : s + 2048], q[s : s + 2048] = bb, qq = quantize_table(t, signed)
            q32 = qq.astype(np.float32)  # exact
            self.n[s : s + 2048] = np.einsum("ij,ij->i", t, t, dtype=np.float64)
            self.that_n[s : s + 2048] = bb * np.sqrt(np.einsum("ij,ij->i", q32, q32,
                                                               dtype=np.float64))
            f = t.astype(np.float64) - q32 * bb[:, None]  # exact: 24-bit by 8-bit products
            self.fn[s : s + 2048] = np.sqrt(np.einsum("ij,ij->i", f, f))
        self.tn = np.sqrt(self.n)
        self.n_max = float(self.n.max())
        self.b_min = float(b.min())
        self.signed, self.cap = signed, int(cap)
        self._two_tn = 2 * self.tn
        self._two_fn = 2 * self.fn
        self._g_that = 2 * GAMMA4 * self.that_n
        self._gamma_d = self.dim * U / (1 - self.dim * U)
        self.padded = -(-v // BLOCK) * BLOCK  # rows padded to a multiple of BLOCK
        self.blocks = self.padded // BLOCK
        pad = self.padded - v
        q = np.concatenate([q, np.zeros((pad, self.dim), dtype=np.int8)])
        b = np.concatenate([b, np.ones(pad)])
        self.session = _session(_model(q, -2.0 * b, signed), 1)  # one thread per chunk
        self.last_pairs = 0  # candidate pairs after step 5, summed since construction

    def chunk_bias(self, e_max: float, y_max: float
                   ) -> tuple[np.ndarray, np.ndarray, float, float]:
        """(β as float32, δ = n - β, M, max |β| + max R) for a chunk (steps 4-5)."""
        spread = e_max * self._two_tn + y_max * (self._two_fn + self._g_that)
        beta32 = np.full(self.padded, PAD_BIAS, dtype=np.float32)
        beta32[: self.n.size] = self.n - spread - GAMMA4 * self.n
        beta = beta32[: self.n.size].astype(np.float64)
        big = spread + GAMMA4 * np.abs(beta)
        delta = self.n - beta
        return beta32, delta, float((big - delta).max()), float(np.abs(beta).max() + big.max())

    def pair_bound(self, en: np.ndarray, yn: np.ndarray, rows: np.ndarray,
                   beta32: np.ndarray) -> np.ndarray:
        """r_j(y) of step 4 for query norms (||e||, ||ŷ||) and table rows ``rows``."""
        bound: np.ndarray = (en * self._two_tn[rows]
                             + yn * (self._two_fn[rows] + self._g_that[rows])
                             + GAMMA4 * np.abs(beta32[rows].astype(np.float64)))
        return bound

    def buffers(self, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """Work space of :meth:`search_chunk` for up to ``chunk`` queries (one per thread)."""
        return (np.empty((chunk, self.padded), dtype=np.float32),
                np.empty((chunk, self.blocks), dtype=np.float32))

    def search_chunk(self, y: np.ndarray, scores: np.ndarray,
                     block_min: np.ndarray) -> tuple[np.ndarray, int]:
        """Nearest rows for the float64 queries ``y`` (one chunk); -1 where the query must
        take the float32 path. Returns (rows, queries decided in float64). The buffers
        come from :meth:`buffers`."""
        m = y.shape[0]
        res = np.full(m, -1, dtype=np.int64)
        top = float(np.abs(y).max())
        a = float(f32_up(top / 127.0)) if top > 0 else 1.0
        if a * self.b_min < TINY:
            return res, 0
        q = np.rint(y / a)  # |y / a| <= 127
        e = y - q * a
        en = np.sqrt(np.einsum("ij,ij->i", e, e))
        yn = a * np.sqrt(np.einsum("ij,ij->i", q, q))
        beta32, delta, big_m, scale = self.chunk_bias(float(en.max()), float(yn.max()))
        o = scores[:m]
        self._run((q + 128).astype(np.uint8), a, beta32, o)

        # step 5: the threshold from the best-scoring row, rounded up to float32. Row
        # j = t * blocks + c is o[:, t, c] below: one pass of elementwise minima over t
        # gives each block's best, and only blocks under the threshold are looked into.
        ov = o.reshape(m, BLOCK, self.blocks)
        bm = np.minimum.reduce(ov, axis=1, out=block_min[:m])
        ar = np.arange(m)
        kb = bm.argmin(axis=1)
        k = ov[ar, :, kb].argmin(axis=1) * self.blocks + kb
        ok = o[ar, k].astype(np.float64)
        rk = self.pair_bound(en, yn, k, beta32)
        thr = ok + delta[k] + rk + big_m + SLACK * (np.abs(ok) + rk + 2 * self.n_max + 2 * scale)
        thr32 = np.nextafter(thr.astype(np.float32), np.float32(np.inf))
        rq, blk = np.divmod(np.flatnonzero(bm <= thr32[:, None]), self.blocks)
        pos, t = np.divmod(np.flatnonzero(ov[rq, :, blk] <= thr32[rq, None]), BLOCK)
        r, c = rq[pos], t * self.blocks + blk[pos]  # r stays sorted
        counts = np.bincount(r, minlength=m)
        sel = counts[r] <= self.cap
        r, c = r[sel], c[sel]
        self.last_pairs += int(r.size)
        if r.size == 0:
            return res, 0

        # step 7: the query's own bounds on the int8 scores, then float32, then float64
        oc = o[r, c].astype(np.float64)
        rb = self.pair_bound(en[r], yn[r], c, beta32)
        slack = SLACK * (float(np.abs(oc).max()) + float(rb.max()) + 2 * self.n_max + 2 * scale)
        r, c = _keep_possible(r, c, oc + delta[c], rb + slack)
        y32 = y.astype(np.float32)
        dots = np.einsum("ij,ij->i", y32[r], self.t32[c])
        s32 = self.n[c] - 2.0 * dots.astype(np.float64)
        ynorm = np.sqrt(np.einsum("ij,ij->i", y, y))
        w = (2 * (self._gamma_d * (1 + U) + U) * ynorm[r] * self.tn[c]
             + SLACK * (np.abs(s32) + self.n_max))
        r, c = _keep_possible(r, c, s32, w)
        n_left = np.bincount(r, minlength=m)
        single = n_left[r] == 1
        res[r[single]] = c[single]
        r, c = r[~single], c[~single]
        if r.size == 0:
            return res, 0
        diff = y[r] - self.t32[c].astype(np.float64)
        dist = np.einsum("ij,ij->i", diff, diff)
        order = np.lexsort((c, dist, r))  # by query, then distance, then row
        r, c = r[order], c[order]
        first = np.r_[True, r[1:] != r[:-1]]
        res[r[first]] = c[first]
        return res, int(first.sum())

    def _run(self, a_op: np.ndarray, a: float, beta32: np.ndarray, out: np.ndarray) -> None:
        import onnxruntime as ort

        io = self.session.io_binding()
        io.bind_cpu_input("A", a_op)
        io.bind_cpu_input("a_scale", np.array(a, dtype=np.float32))
        io.bind_cpu_input("bias", beta32)
        io.bind_ortvalue_output("O", ort.OrtValue.ortvalue_from_numpy(out))
        self.session.run_with_iobinding(io)


def _keep_possible(r: np.ndarray, c: np.ndarray, mid: np.ndarray, half: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (query r, row c), r sorted, whose score interval [mid - half, mid + half]
    can hold the query's minimum: lower end <= the smallest upper end of its group."""
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    best_hi = np.minimum.reduceat(mid + half, starts)
    group = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, r.size]))
    keep = mid - half <= best_hi[group]
    return r[keep], c[keep]
