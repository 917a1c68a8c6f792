"""DPNR: Laplace noise on a [0, 1]-scaled sentence vector (Lyu, He, Li 2020, §3.3).

The vector is min-max scaled by its own minimum and maximum (Algorithm 2,
step 3), then i.i.d. Laplace(0, b) noise is added to every coordinate.

Calibration, named plainly:

* ``"vector"`` (default, honest): b = r/ε. Two vectors in [0, 1]^r differ by at
  most r in L1 norm, so the whole vector is ε-DP.
* ``"coordinate"`` (as published): b = 1/ε, the sensitivity of one coordinate.
  Each coordinate is ε-DP; the whole vector is only (r·ε)-DP.

Word dropout with rate μ is applied by the edge to the tokens before encoding;
it lowers a guarantee ε to ε' = ln((1-μ)e^ε + μ) (Theorem 2).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, Field

from shared.arrays import STRICT, PosFloat
from shared.mechanisms.checks import finite_array, in_unit_interval, positive
from shared.mechanisms.registry import BaseMechanism, PayloadKind, encoder_dim, need
from shared.rng import resolve_rng

CALIBRATIONS = ("vector", "coordinate")


def min_max_scale(vec: np.ndarray) -> np.ndarray:
    """Scale each row to [0, 1] by its own min and max (a constant row becomes zeros)."""
    v = np.asarray(vec, dtype=np.float64)
    lo = v.min(axis=-1, keepdims=True)
    span = v.max(axis=-1, keepdims=True) - lo
    safe = np.where(span > 0, span, 1.0)
    return np.where(span > 0, (v - lo) / safe, 0.0)


def dropout_epsilon(epsilon: float, mu: float) -> float:
    """ε' = ln((1-μ)e^ε + μ): the guarantee after word dropout of rate μ (Theorem 2)."""
    # log1p form stays finite for large ε: ln(μ + (1-μ)e^ε) = ε + ln(1-μ + μ e^-ε)
    return epsilon + math.log((1.0 - mu) + mu * math.exp(-epsilon))


class LaplaceParams(BaseModel):
    """DPNR: ε > 0, calibration, word dropout μ in [0, 1)."""

    model_config = STRICT
    epsilon: PosFloat
    calibration: Literal["vector", "coordinate"] = "vector"
    word_dropout: Annotated[float, Field(strict=True, ge=0, lt=1)] = 0.0


class Laplace(BaseMechanism):
    """DPNR sentence-vector mechanism."""

    name = "laplace"
    Params = LaplaceParams
    payload_kind = PayloadKind.VECTOR
    family = "laplace"
    param_help = {
        "epsilon": "epsilon > 0",
        "calibration": "noise scale r/eps (vector, default: the whole vector is eps-DP) or "
                       "1/eps (coordinate, as published: r*eps for the vector)",
        "word_dropout": "DPNR word dropout rate in [0, 1), before encoding",
    }
    param_metavar = {"word_dropout": "MU"}

    def __init__(self, epsilon: float, calibration: str = "vector", word_dropout: float = 0.0):
        self.epsilon = positive("epsilon", epsilon)
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        self.calibration = calibration
        self.word_dropout = in_unit_interval("word_dropout", word_dropout)

    @property
    def params(self) -> dict:
        return {
            "epsilon": self.epsilon,
            "calibration": self.calibration,
            "word_dropout": self.word_dropout,
        }

    @classmethod
    def from_params(cls, params, bundle=None, *, dim=None, secret=None) -> Laplace:
        """Needs the bundle's encoder (or ``dim``): the vectors come from it."""
        encoder_dim(cls.name, bundle, dim)
        return cls(need(cls.name, params, "epsilon"),
                   params.get("calibration") or "vector", params.get("word_dropout") or 0.0)

    def privatize_vectors(self, vectors, onehot, rng) -> tuple[np.ndarray, None]:
        return self.privatize(vectors, rng), None

    def scale(self, dim: int) -> float:
        """Laplace scale b: r/ε ("vector") or 1/ε ("coordinate")."""
        return (dim if self.calibration == "vector" else 1) / self.epsilon

    def privatize(self, vec: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Noisy scaled vector; ``vec`` is (r,) or a batch (b, r). Returns float64."""
        v = np.asarray(vec)
        if v.ndim not in (1, 2):
            raise ValueError(f"vec must have shape (r,) or (b, r), got {v.shape}")
        v = finite_array("vec", v, ndim=v.ndim)
        if v.shape[-1] == 0:
            raise ValueError(f"vec must have at least 1 value (dimension r >= 1), got shape "
                             f"{v.shape}")
        rng = resolve_rng(rng)
        scaled = min_max_scale(v)
        return scaled + rng.laplace(0.0, self.scale(v.shape[-1]), size=scaled.shape)
