"""The exact nearest-regular-token search of ``shared.mechanisms.nearest.ExactNearest``,
with its candidate pass run by torch (on the GPU when there is one).

Same math, same answer: the float32 scores s(t) = ||t||^2 - 2 y.t come from one GEMM
with the augmented table of the shared index; a query whose best score beats the
second best by more than the shared rounding bound (valid for any summation order
of an IEEE float32 dot product, which is what CPU and CUDA SGEMM compute when TF32
is off) has a proven nearest token; every other query is handed to the shared numpy
index itself, which re-ranks its candidates in float64. Noise is never drawn here:
callers pass the noisy embeddings that ``shared`` sampled.

On CPU it also keeps the training process on one thread pool (torch's), instead of
numpy's OpenBLAS threads spinning next to torch's after every search.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from shared.mechanisms.nearest import ExactNearest


@contextlib.contextmanager
def full_float32_matmul():
    """TF32 / bf16 GEMM passes would void the rounding bound: force IEEE float32."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


class TorchExactNearest:
    """``ExactNearest.search`` with the GEMM on ``device``; identical results."""

    def __init__(self, index: ExactNearest, device: torch.device | str = "cpu", chunk: int = 4096):
        self.index = index
        self.device = torch.device(device)
        self.aug_t = torch.from_numpy(index._aug).to(self.device).T.contiguous()  # (w, V)
        self.chunk = int(chunk)
        self.last_delegated = 0  # queries answered by the numpy index in the last call

    def search(self, queries: np.ndarray) -> np.ndarray:
        """Ids of the exact nearest rows (``index.ids``), one per query row."""
        idx = self.index
        y64 = np.asarray(queries, dtype=np.float64)
        if y64.ndim != 2 or y64.shape[1] != idx.dim:
            raise ValueError(f"queries must have shape (m, {idx.dim}), got {y64.shape}")
        if not np.isfinite(y64).all():
            raise ValueError("queries contain NaN or Inf")
        m = y64.shape[0]
        if m == 0:
            return np.empty(0, dtype=np.int64)
        if self.aug_t.shape[1] < 2:  # a one-token table: nothing to rank
            return idx.search(y64)
        y_aug = np.zeros((m, idx._width), dtype=np.float32)
        y_aug[:, : idx.dim] = y64
        y_aug[:, idx.dim] = 1.0
        y_t = torch.from_numpy(y_aug).to(self.device)
        best, smin, second = [], [], []
        with torch.no_grad(), full_float32_matmul():
            for s in range(0, m, self.chunk):
                scores = y_t[s : s + self.chunk] @ self.aug_t
                two = torch.topk(scores, 2, dim=1, largest=False, sorted=True)
                best.append(two.indices[:, 0])
                smin.append(two.values[:, 0])
                second.append(two.values[:, 1])
        best_np = torch.cat(best).cpu().numpy().astype(np.int64)
        smin_np = torch.cat(smin).cpu().numpy().astype(np.float64)
        second_np = torch.cat(second).cpu().numpy()
        # the shared index's threshold, computed the same way
        thr = smin_np + 2.0 * idx.score_bound(np.linalg.norm(y64, axis=1))
        thr32 = np.nextafter(thr.astype(np.float32), np.float32(np.inf))
        ambiguous = np.flatnonzero(second_np <= thr32)
        self.last_delegated = int(ambiguous.size)
        out = idx.ids[best_np]
        if ambiguous.size:
            out[ambiguous] = idx.search(y64[ambiguous])
        return out
