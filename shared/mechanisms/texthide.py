"""(m, k)-TextHide (Huang, Song, Chen, Li, Arora 2020, Algorithm 1).

Each representation is mixed with k-1 others of the same batch (random
permutations π_2..π_k, π_1 = identity) with non-negative weights summing to 1,
then multiplied entry-wise by a ±1 mask drawn from a secret pool of m masks.
Labels are mixed with the same weights. There is no differential-privacy
guarantee; security rests on a conjectured computational hardness.

Weights: ``"abs-normal"`` as published (|N(0, I_k)| normalised to sum to 1),
``"dirichlet"`` (Dirichlet(α), α = 1 is uniform on the simplex), or
``"equal"`` (1/k each).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from pydantic import BaseModel

from shared.arrays import STRICT, PosInt
from shared.ledger import counted
from shared.mechanisms.checks import finite_array, positive, positive_int
from shared.mechanisms.registry import (
    COST,
    FLOOR,
    GUARANTEE,
    BaseMechanism,
    PayloadKind,
    encoder_dim,
    need,
)
from shared.rng import resolve_rng

if TYPE_CHECKING:
    from shared.bundle import EdgeBundle

WEIGHTINGS = ("abs-normal", "dirichlet", "equal")
POOL_CHUNK = 1 << 20  # mask entries drawn at a time


def available_memory() -> int | None:
    """Bytes of physical memory available now (Linux), else all of it, else None."""
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return int(os.sysconf(name)) * int(os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, OSError, ValueError):
            continue
    return None


POOL_LIMIT = 1 << 30  # bytes: a pool of 2^30 int8 mask values takes seconds to draw


def check_pool_memory(m: int, dim: int) -> None:
    """ValueError if the (m, dim) int8 mask pool needs more than 1 GiB or more than half of
    the available memory (the published m are in the hundreds)."""
    need = m * dim
    avail = available_memory()
    limit = POOL_LIMIT if avail is None else min(POOL_LIMIT, avail // 2)
    if need > limit:
        where = "the 1 GiB limit" if limit == POOL_LIMIT else \
            f"half of the {cast(int, avail) / 2**30:.3g} GiB of memory available"
        raise ValueError(f"m={m} is too large: the mask pool needs {need / 2**30:.3g} GiB "
                         f"({m} masks x {dim} values), more than {where}")


class TextHideParams(BaseModel):
    """TextHide: pool of m masks, k examples mixed."""

    model_config = STRICT
    m: PosInt
    k: PosInt


class TextHide(BaseMechanism):
    """Mask pool from ``seed`` (the client's secret key); mixing randomness per call."""

    name = "texthide"
    Params = TextHideParams
    payload_kind = PayloadKind.VECTOR
    family = "texthide"
    has_epsilon = False
    edge_options = frozenset({"texthide_key", "texthide_seed", "num_labels"})
    param_help = {"m": "size of the secret mask pool",
                  "k": "inputs mixed per record (predictions use 1)"}
    edge_defaults = {"k": 1}  # the edge: one input per payload unless asked

    def __init__(
        self,
        m: int,
        k: int,
        dim: int,
        seed: int | None = None,
        weights: str = "abs-normal",
        alpha: float = 1.0,
    ):
        self.m = positive_int("m", m)
        self.k = positive_int("k", k)
        self.dim = positive_int("dim", dim)
        if weights not in WEIGHTINGS:
            raise ValueError(f"weights must be one of {WEIGHTINGS}, got {weights!r}")
        self.weights = weights
        self.alpha = positive("alpha", alpha)
        check_pool_memory(self.m, self.dim)
        pool_rng = np.random.default_rng(seed)  # seed None: fresh OS entropy
        self.pool = np.empty((self.m, self.dim), dtype=np.int8)
        rows = max(1, POOL_CHUNK // self.dim)  # the same draws as one call, in chunks
        for s in range(0, self.m, rows):
            block = pool_rng.random((min(rows, self.m - s), self.dim))
            self.pool[s : s + block.shape[0]] = np.where(block < 0.5, -1, 1)

    @property
    def params(self) -> dict[str, Any]:
        return {"m": self.m, "k": self.k}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], bundle: EdgeBundle | None = None, *,
                    dim: int | None = None, secret: int | None = None) -> TextHide:
        """``secret``: the mask-pool seed (None: a fresh pool from OS entropy)."""
        return cls(need(cls.name, params, "m"), need(cls.name, params, "k"),
                   encoder_dim(cls.name, bundle, dim), seed=secret)

    @classmethod
    def compared_params(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """Only the mask pool m: k is how many inputs a payload mixes (predictions use
        k = 1, whatever k trained the model)."""
        return {"m": params.get("m")}

    @classmethod
    def prediction_params(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """k = 1: a prediction hides one input, whatever k trained the model."""
        return {**params, "k": 1}

    @classmethod
    def mixes_inputs(cls, params: Mapping[str, Any]) -> bool:
        return int(params.get("k") or 1) > 1

    def privatize_vectors(self, vectors: np.ndarray, onehot: np.ndarray | None,
                          rng: np.random.Generator | None
                          ) -> tuple[np.ndarray, np.ndarray | None]:
        if self.k > 1 and onehot is None:
            raise ValueError("TextHide with k > 1 mixes the inputs and their labels: use "
                             "privatize_records(...) for training records; predictions use k=1")
        return self.encrypt(vectors, onehot, rng)

    def mixing_weights(self, b: int, rng: np.random.Generator) -> np.ndarray:
        """(b, k) non-negative weights, each row summing to 1."""
        if self.weights == "equal":
            return np.full((b, self.k), 1.0 / self.k)
        if self.weights == "dirichlet":
            return rng.dirichlet(np.full(self.k, self.alpha), size=b)
        w = np.abs(rng.standard_normal((b, self.k)))
        w = np.where(w.sum(axis=1, keepdims=True) > 0, w, 1.0)
        weights: np.ndarray = w / w.sum(axis=1, keepdims=True)
        return weights

    def encrypt(
        self,
        reps: np.ndarray,
        labels: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Hide a batch: reps (b, dim), labels (b, c) one-hot or soft, or None.

        Returns (hidden (b, dim) float32, mixed labels (b, c) float64 or None).
        """
        x = finite_array("reps", reps, ndim=2, dim=self.dim).astype(np.float64)
        b = x.shape[0]
        if self.k > b:
            raise ValueError(f"k must be <= the batch size {b} (k mixes k examples), got k={self.k}")
        rng = resolve_rng(rng)
        sources = np.empty((b, self.k), dtype=np.int64)
        sources[:, 0] = np.arange(b)
        if self.k > 1:
            sources[:, 1:] = rng.permuted(np.tile(np.arange(b), (self.k - 1, 1)), axis=1).T
        lam = self.mixing_weights(b, rng)
        mixed = np.einsum("bk,bkd->bd", lam, x[sources])
        masks = self.pool[rng.integers(0, self.m, size=b)]
        hidden = (mixed * masks).astype(np.float32)
        if labels is None:
            return hidden, None
        y = finite_array("labels", labels, ndim=2).astype(np.float64)
        if y.shape[0] != b:
            raise ValueError(f"labels must have one row per representation ({b}), got {y.shape}")
        return hidden, np.einsum("bk,bkc->bc", lam, y[sources])


# -- its cost, floor and guarantee, registered in the registry's tables: ``shared.ledger``,
# ``shared.floor`` and ``shared.accounting`` find them there ---------------------------
COST.register(TextHide)(counted)  # no ε: its sends are counted


@FLOOR.register(TextHide)
def _floor(mech: TextHide, bundle: EdgeBundle | None, *, threshold: float,
           dim: int | None, **_: Any) -> str | None:
    return None  # no differential-privacy guarantee to fall below (shared.accounting)


@GUARANTEE.register(TextHide)
def _guarantee(mech: TextHide, bundle: EdgeBundle | None, *, dim: int | None,
               sample: int) -> dict[str, Any]:
    return {"nominal": {"epsilon": None}, "worst_case": {"epsilon": None},
            "notes": [f"No differential-privacy guarantee. (m, k) = ({mech.m}, {mech.k}): k "
                      "inputs mixed, masks from a pool of m; security rests on a conjectured "
                      "computational hardness (Huang et al. 2020)."]}
