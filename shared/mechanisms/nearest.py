"""Exact Euclidean nearest neighbour over an embedding table, proven by a bound.

DChiText (Qu et al. 2021 §3.2.4, after Feyisetan et al. 2020) returns the
vocabulary token nearest to the noisy embedding. Approximate indexes change the
mechanism (recall@1 of 2-48% on noisy queries), so this search is exact:

1. Candidate pass in float32 with one GEMM per chunk of queries, scoring
   s(t) = ||t||^2 - 2 y.t (||y||^2 is constant per query). The table is stored
   augmented as [-2t, ||t||^2, 0...] and the queries as [y, 1, 0...], so the
   GEMM produces the scores directly; chunks of a few hundred queries keep the
   score block in cache. Both make it about twice as fast as one big GEMM over
   4,096 queries followed by separate passes (bench/mechanisms.py).
2. Every float32 score is within ``delta(y)`` of the real score (standard
   rounding-error bound for a dot product in any summation order, Higham,
   *Accuracy and Stability of Numerical Algorithms*, §3.1: gamma_n = n u / (1 - n u)).
   Every token whose float32 score is within 2 delta of the smallest one could be
   the true nearest; all others provably cannot.
3. Those candidates (almost always exactly one) are re-ranked by ||y - t||^2 in
   float64. Ties go to the smallest row index.
"""

from __future__ import annotations

import math

import numpy as np

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


class ExactNearest:
    """Exact L2 nearest row of ``table`` for batches of query vectors.

    ``ids`` maps table rows to the ids returned (e.g. the regular vocabulary ids).
    """

    def __init__(self, table: np.ndarray, ids: np.ndarray | None = None, chunk: int = 256):
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

    def score_bound(self, query_norms: np.ndarray) -> np.ndarray:
        """Upper bound on |float32 score - real score| for queries of these norms.

        Rounding y to float32 (2u||y|| ||t||), ||t||^2 to float32 (u||t||^2) and the
        dot product of the augmented vectors (gamma_w (2||y|| ||t|| + ||t||^2)) are
        each covered by gamma_{w+4} (2||y|| t_max + t_max^2); the sum is doubled again.
        """
        t = self._tmax
        return 4.0 * self._gamma * (2.0 * query_norms * t + t * t)

    def search(self, queries: np.ndarray) -> np.ndarray:
        """Ids of the exact nearest rows, one per query row."""
        y64 = np.asarray(queries, dtype=np.float64)
        if y64.ndim != 2 or y64.shape[1] != self.dim:
            raise ValueError(f"queries must have shape (m, {self.dim}), got {y64.shape}")
        if not np.isfinite(y64).all():
            raise ValueError("queries contain NaN or Inf")
        top = float(np.abs(y64).max()) if y64.size else 0.0
        # the cheap bound max|y| sqrt(n) first; the exact norms only near the limit, so that
        # every query shared.floor.check_dchi_eta lets through is searched
        if top > 0 and scores_overflow(top * math.sqrt(self.dim), self._tmax) \
                and scores_overflow(_max_norm(y64, top), self._tmax):
            raise ValueError("queries are too large for the float32 candidate pass (their "
                             "scores would overflow)")
        out = np.empty(y64.shape[0], dtype=np.int64)
        buf = np.zeros((min(self.chunk, max(1, y64.shape[0])), self._width), dtype=np.float32)
        buf[:, self.dim] = 1.0
        reranked = 0
        for start in range(0, y64.shape[0], self.chunk):
            yc = y64[start : start + self.chunk]
            k = yc.shape[0]
            buf[:k, : self.dim] = yc
            out[start : start + k], amb = self._search_chunk(yc, buf[:k])
            reranked += amb
        self.last_rerank_count = reranked
        return self.ids[out]

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
