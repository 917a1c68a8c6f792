"""Exact Euclidean nearest neighbour over an embedding table, proven by a bound.

DChiText (Qu et al. 2021 §3.2.4, after Feyisetan et al. 2020) returns the
vocabulary token nearest to the noisy embedding. Approximate indexes change the
mechanism (their recall@1 on noisy queries is low: ``bench/mechanisms.py``), so this
search is exact:

1. Candidate pass in float32 with one GEMM per chunk of queries, scoring
   s(t) = ||t||^2 - 2 y.t (||y||^2 is constant per query). The table is stored
   augmented as [-2t, ||t||^2, 0...] and the queries as [y, 1, 0...], so the
   GEMM produces the scores directly; chunks of a few hundred queries keep the
   score block in cache. Both make it faster than one big GEMM over thousands of
   queries followed by separate passes (``bench/mechanisms.py``).
2. Every float32 score is within ``delta(y)`` of the real score (standard
   rounding-error bound for a dot product in any summation order, Higham,
   *Accuracy and Stability of Numerical Algorithms*, §3.1: gamma_n = n u / (1 - n u)).
   Every token whose float32 score is within 2 delta of the smallest one could be
   the true nearest; all others provably cannot.
3. Those candidates (almost always exactly one) are re-ranked by ||y - t||^2 in
   float64. Ties go to the smallest row index.

Where it is faster on the machine, the candidate pass is an int8 GEMM instead
(``shared.mechanisms.int8_pass``: onnxruntime's integer kernels, twice the
float32 rate on AVX2 and more with VNNI) with its own proven bound; a query it
cannot narrow to a few candidates takes the float32 pass above. ``backend="auto"``
(the default) builds it at the first search of at least 8 chunks when
onnxruntime is installed and the table is large, checks that the integer kernel
the machine runs is exact (:func:`~shared.mechanisms.int8_pass.integer_gemm_is_exact`),
then times the two passes on the first chunks of real queries (both are exact, so
the timing costs nothing; CPU seconds, which a busy machine disturbs less than wall
time) and keeps the faster one.
"""

from __future__ import annotations

import math
import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from shared.mechanisms import int8_pass

if TYPE_CHECKING:
    from shared.mechanisms.int8_pass import Int8CandidatePass

_U32 = float(np.finfo(np.float32).eps) / 2  # unit roundoff of float32
_F32_MAX = float(np.finfo(np.float32).max)


def scores_overflow(query_norm: float, t_max: float) -> bool:
    """Whether the float32 scores ||t||² - 2 y·t of queries of norm up to ``query_norm``
    against rows of norm up to ``t_max`` (with room for the error bound) can overflow."""
    return (query_norm + 1.0) * (2.0 * t_max + t_max * t_max + 1.0) * 16.0 > _F32_MAX


def _max_norm(y: np.ndarray, top: float) -> float:
    """The largest row norm of ``y`` whose largest |value| is ``top`` > 0, without
    overflowing (the rows are scaled by 1/top first)."""
    z = y / top
    return top * math.sqrt(float(np.einsum("ij,ij->i", z, z).max()))


AUTO_MIN_ROWS = 4096  # smaller tables stay on the float32 pass (no session to build)
MAX_WORKERS = 8  # each int8 worker holds a (chunk, rows) float32 score buffer
AUTO_MIN_QUERIES_CHUNKS = 8  # a search this many chunks long builds the int8 pass: short
# runs (a CLI on a few lines) never pay for building it
BACKENDS = ("auto", "int8", "fp32")


class NearestIndex(Protocol):
    """What a mechanism asks of its nearest-row search: :class:`ExactNearest`, or a twin
    with the same answers on another device (``models.nets.torch_nearest``)."""

    def search(self, queries: np.ndarray) -> np.ndarray:
        """Ids of the exact nearest rows, one per query row."""
        ...


class ExactNearest:
    """Exact L2 nearest row of ``table`` for batches of query vectors.

    ``ids`` maps table rows to the ids returned (e.g. the regular vocabulary ids).
    ``backend``: "auto" (the faster exact candidate pass on this machine), "int8"
    (RuntimeError where the int8 pass cannot run exactly) or "fp32".
    """

    def __init__(self, table: np.ndarray, ids: np.ndarray | None = None, chunk: int = 256,
                 backend: str = "auto"):
        table = np.asarray(table)
        if table.ndim != 2 or table.shape[0] == 0:
            raise ValueError(f"table must be a non-empty 2-D array, got shape {table.shape}")
        t32 = np.ascontiguousarray(table, dtype=np.float32)
        self._t32 = t32  # float64 copies are made only for the few re-ranked rows
        self.dim = t32.shape[1]
        t64 = t32.astype(np.float64)
        norms64 = np.einsum("ij,ij->i", t64, t64)
        self._width = -(-(self.dim + 1) // 16) * 16  # augmented width, padded with zeros
        aug = np.zeros((t32.shape[0], self._width), dtype=np.float32)
        aug[:, : self.dim] = -2.0 * t32  # exact: scaling by a power of two
        aug[:, self.dim] = norms64
        self._aug = aug
        self._tmax = float(np.sqrt(norms64.max()))
        terms = self._width + 4
        self._gamma = terms * _U32 / (1 - terms * _U32)
        self.ids = (
            np.arange(table.shape[0], dtype=np.int64)
            if ids is None
            else np.asarray(ids, dtype=np.int64)
        )
        if self.ids.shape != (table.shape[0],):
            raise ValueError("ids must have one entry per table row")
        self.chunk = int(chunk)
        self.last_rerank_count = 0  # queries re-ranked in float64 in the last call
        self.last_fallback_count = 0  # queries the int8 pass handed to the float32 pass
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.kernel_info: dict[str, Any] = {"requested": backend}
        self._int8: Int8CandidatePass | None = None
        self._timings: dict[str, list[float]] = {"int8": [], "fp32": []}
        self.backend = "fp32"  # the pass in use; "probing" while auto times the two
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        self._workers = max(1, min(cores, MAX_WORKERS))  # int8 chunks run on this many threads
        self._buffers: queue.SimpleQueue[tuple[np.ndarray, np.ndarray]] = queue.SimpleQueue()
        if backend == "int8":
            if not self._build_int8():
                raise RuntimeError(f"the int8 candidate pass cannot run here: {self.kernel_info}")
            self.backend = "int8"
        self._pending = backend == "auto" and table.shape[0] >= AUTO_MIN_ROWS

    def _build_int8(self) -> bool:
        """Build the int8 pass if onnxruntime is there and its integer GEMM is exact here:
        u8·s8 operands (MLAS's faster kernels; the table is quantized so that the
        int16 pair sums of its non-VNNI kernel cannot saturate), else u8·u8; each is
        checked by a probe on this machine, not assumed from the CPU flags."""
        info = self.kernel_info
        if self.dim > int8_pass.MAX_DIM:
            info["int8"] = f"dim {self.dim} > {int8_pass.MAX_DIM}"
            return False
        try:
            import onnxruntime
        except ImportError:
            info["int8"] = "onnxruntime is not installed"
            return False
        flags = int8_pass.cpu_flags()
        info.update(onnxruntime=onnxruntime.__version__,
                    vnni=sorted(flags & int8_pass.VNNI_FLAGS), avx2="avx2" in flags)
        for signed in (True, False):
            operands = "u8s8" if signed else "u8u8"
            exact = int8_pass.integer_gemm_is_exact(signed, self.dim)
            info[f"{operands}_exact"] = exact
            if exact:
                self._int8 = int8_pass.Int8CandidatePass(self._t32, signed=signed)
                info["int8"] = operands
                for _ in range(self._workers):
                    self._buffers.put(self._int8.buffers(self.chunk))
                # warm-up (first-run allocations) before anything is timed
                self._int8_rows(np.zeros((min(8, self.chunk), self.dim)))
                return True
        info["int8"] = "no exact integer kernel"
        return False

    def score_bound(self, query_norms: np.ndarray) -> np.ndarray:
        """Upper bound on |float32 score - real score| for queries of these norms.

        Rounding y to float32 (2u||y|| ||t||), ||t||^2 to float32 (u||t||^2) and the
        dot product of the augmented vectors (gamma_w (2||y|| ||t|| + ||t||^2)) are
        each covered by gamma_{w+4} (2||y|| t_max + t_max^2); the sum is doubled again.
        """
        t = self._tmax
        bound: np.ndarray = 4.0 * self._gamma * (2.0 * query_norms * t + t * t)
        return bound

    def search(self, queries: np.ndarray) -> np.ndarray:
        """Ids of the exact nearest rows, one per query row."""
        y64 = np.asarray(queries, dtype=np.float64)
        if y64.ndim != 2 or y64.shape[1] != self.dim:
            raise ValueError(f"queries must have shape (m, {self.dim}), got {y64.shape}")
        if not np.isfinite(y64).all():
            raise ValueError("queries contain NaN or Inf")
        top = float(np.abs(y64).max()) if y64.size else 0.0
        # the cheap bound max|y| sqrt(n) first; the exact norms only near the limit, so that
        # every query shared.mechanisms.computable.check_dchi_eta lets through is searched
        if top > 0 and scores_overflow(top * math.sqrt(self.dim), self._tmax) \
                and scores_overflow(_max_norm(y64, top), self._tmax):
            raise ValueError("queries are too large for the float32 candidate pass (their "
                             "scores would overflow)")
        m = y64.shape[0]
        if self._pending and m >= AUTO_MIN_QUERIES_CHUNKS * self.chunk:
            self._pending = False
            self.backend = "probing" if self._build_int8() else "fp32"
        self.last_rerank_count = self.last_fallback_count = 0
        if self.backend == "fp32":
            ids: np.ndarray = self.ids[self._fp32_block(y64)]
            return ids
        # similar query scales share a chunk: the int8 step is set by the chunk's max |y|
        order = np.argsort(np.abs(y64).max(axis=1), kind="stable")
        out = np.empty(m, dtype=np.int64)
        unit = self._workers * self.chunk  # what the workers run at once: the probe's unit
        for start in range(0, m, unit):
            sel = order[start : start + unit]
            path = self._next_path()
            t = time.process_time()
            if path == "fp32":
                out[sel] = self._fp32_block(y64[sel])
            else:
                out[sel] = self._int8_rows(y64[sel])
            if self.backend == "probing":  # a probe pays its own fallbacks at once
                self._fallback(y64, sel, out)
                if sel.size == unit:
                    self._timings[path].append(time.process_time() - t)
                    self._decide()
        self._fallback(y64, np.arange(m), out)
        return self.ids[out]

    def _fallback(self, y64: np.ndarray, sel: np.ndarray, out: np.ndarray) -> None:
        """The float32 pass, in one go, for the queries the int8 pass handed back (-1)."""
        back = sel[out[sel] < 0]
        if back.size:
            self.last_fallback_count += int(back.size)
            out[back] = self._fp32_block(y64[back])

    def _next_path(self) -> str:
        if self.backend != "probing":
            return self.backend
        return "int8" if len(self._timings["int8"]) <= len(self._timings["fp32"]) else "fp32"

    def _decide(self, rounds: int = 2) -> None:
        """After ``rounds`` full units on each pass, keep the faster (best unit of each).
        Units are timed in CPU seconds of the process (all its threads), which other jobs
        on the machine disturb far less than wall time; both passes use every core."""
        t8, t32 = self._timings["int8"], self._timings["fp32"]
        if min(len(t8), len(t32)) >= rounds:
            self.backend = "int8" if min(t8) < min(t32) else "fp32"
            self.kernel_info["probe_s"] = {"int8": min(t8), "fp32": min(t32)}

    def _int8_rows(self, y64: np.ndarray) -> np.ndarray:
        """Rows of the nearest neighbours by the int8 pass, -1 for the queries it hands
        back. Chunks run on ``self._workers`` threads (onnxruntime and numpy release the
        GIL), each with its own score and block-minimum buffers and one onnxruntime thread."""
        chunks = [np.arange(s, min(s + self.chunk, y64.shape[0]))
                  for s in range(0, y64.shape[0], self.chunk)]

        int8 = cast("Int8CandidatePass", self._int8)  # built before this pass runs

        def run(sel: np.ndarray) -> tuple[np.ndarray, int]:
            bufs = self._buffers.get()
            try:
                return int8.search_chunk(y64[sel], *bufs)
            finally:
                self._buffers.put(bufs)

        if len(chunks) > 1 and self._workers > 1:
            with ThreadPoolExecutor(self._workers) as pool:
                results = list(pool.map(run, chunks))
        else:
            results = [run(sel) for sel in chunks]
        out = np.empty(y64.shape[0], dtype=np.int64)
        for sel, (rows, reranked) in zip(chunks, results, strict=True):
            out[sel] = rows
            self.last_rerank_count += reranked
        return out

    def _fp32_block(self, y64: np.ndarray) -> np.ndarray:
        """Rows of the nearest neighbours by the float32 pass, in chunks."""
        out = np.empty(y64.shape[0], dtype=np.int64)
        buf = np.zeros((min(self.chunk, max(1, y64.shape[0])), self._width), dtype=np.float32)
        buf[:, self.dim] = 1.0
        for start in range(0, y64.shape[0], self.chunk):
            yc = y64[start : start + self.chunk]
            k = yc.shape[0]
            buf[:k, : self.dim] = yc
            out[start : start + k], amb = self._search_chunk(yc, buf[:k])
            self.last_rerank_count += amb
        return out

    def _search_chunk(self, y64: np.ndarray, y_aug: np.ndarray) -> tuple[np.ndarray, int]:
        scores = y_aug @ self._aug.T
        rows = np.arange(scores.shape[0])
        best = scores.argmin(axis=1)
        smin = scores[rows, best].astype(np.float64)
        scores[rows, best] = np.inf
        second = scores.min(axis=1)
        # Threshold in float64, then rounded up to float32 so no candidate is lost.
        thr = smin + 2.0 * self.score_bound(np.linalg.norm(y64, axis=1))
        thr32 = np.nextafter(thr.astype(np.float32), np.float32(np.inf))
        ambiguous = np.flatnonzero(second <= thr32)
        if ambiguous.size == 0:
            return best, 0
        within = scores[ambiguous] <= thr32[ambiguous, None]
        within[np.arange(ambiguous.size), best[ambiguous]] = True
        r, c = np.nonzero(within)
        diff = y64[ambiguous[r]] - self._t32[c].astype(np.float64)
        d = np.einsum("ij,ij->i", diff, diff)
        order = np.lexsort((c, d, r))  # by row, then distance, then index
        first = np.ones(order.size, dtype=bool)
        first[1:] = r[order][1:] != r[order][:-1]
        best[ambiguous[r[order][first]]] = c[order][first]
        return best, int(ambiguous.size)


def brute_force_nearest(table: np.ndarray, queries: np.ndarray, chunk: int = 512) -> np.ndarray:
    """Reference search in float64 over every row (tests): argmin ||y - t||^2, ties to the
    lowest index. float64 leaves errors near 1e-13, far below any gap random data has."""
    t = np.asarray(table, dtype=np.float64)
    norms = np.einsum("ij,ij->i", t, t)
    y = np.asarray(queries, dtype=np.float64)
    out = np.empty(len(y), dtype=np.int64)
    for s in range(0, len(y), chunk):
        yc = y[s : s + chunk]
        d = norms[None, :] - 2.0 * (yc @ t.T) + np.einsum("ij,ij->i", yc, yc)[:, None]
        best = np.argmin(d, axis=1)
        dmin = d[np.arange(len(yc)), best]
        near = d <= (dmin + 1e-9 * (1.0 + np.abs(dmin)))[:, None]
        for i in np.flatnonzero(near.sum(axis=1) > 1):  # near-ties: direct form decides
            cand = np.flatnonzero(near[i])
            diff = t[cand] - yc[i]
            best[i] = cand[np.argmin(np.einsum("ij,ij->i", diff, diff))]
        out[s : s + len(yc)] = best
    return out


def gemm_nearest(table: np.ndarray, queries: np.ndarray, batch: int = 4096) -> np.ndarray:
    """The plain numpy baseline: argmin of ||E||^2 - 2 y E^T, one GEMM per batch of 4,096."""
    t = np.asarray(table, dtype=np.float32)
    norms = (t * t).sum(axis=1)
    out = np.empty(len(queries), dtype=np.int64)
    for s in range(0, len(queries), batch):
        y = np.asarray(queries[s : s + batch], dtype=np.float32)
        out[s : s + len(y)] = np.argmin(norms[None, :] - 2 * (y @ t.T), axis=1)
    return out


def kth_neighbour_distances(
    table: np.ndarray, rows: np.ndarray, ks: tuple[int, ...], chunk: int = 256
) -> dict[int, np.ndarray]:
    """Euclidean distance from each of ``table[rows]`` to its k-th nearest other row.

    Returns {k: distances (len(rows),)}. Exact up to float32 rounding of the scores
    (used for reporting, not for privatizing).
    """
    t32 = np.asarray(table, dtype=np.float32)
    norms = np.einsum("ij,ij->i", t32, t32)
    kmax = max(ks)
    if kmax >= t32.shape[0]:
        raise ValueError(f"k must be < the number of rows ({t32.shape[0]}), got {kmax}")
    out = {k: np.empty(len(rows), dtype=np.float64) for k in ks}
    for s in range(0, len(rows), chunk):
        r = np.asarray(rows[s : s + chunk])
        d2 = norms[r, None] - 2.0 * (t32[r] @ t32.T) + norms[None, :]
        d2[np.arange(r.size), r] = np.inf  # not its own neighbour
        part = np.partition(d2, [k - 1 for k in ks], axis=1)
        for k in ks:
            out[k][s : s + r.size] = np.sqrt(np.maximum(part[:, k - 1], 0.0))
    return out
