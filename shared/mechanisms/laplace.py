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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from shared import messages as msg
from shared.accounting import laplace_vector_epsilon, sentence_vector_dim
from shared.arrays import STRICT, PosFloat
from shared.floor import LAPLACE_STEP, vector_dim
from shared.ledger import Cost, check_count, finite_cost
from shared.mechanisms.checks import finite_array, in_unit_interval, positive
from shared.mechanisms.computable import F32_MAX, TAIL
from shared.mechanisms.registry import (
    COMPUTABLE,
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
    def params(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "calibration": self.calibration,
            "word_dropout": self.word_dropout,
        }

    @classmethod
    def from_params(cls, params: Mapping[str, Any], bundle: EdgeBundle | None = None, *,
                    dim: int | None = None, secret: int | None = None) -> Laplace:
        """Needs the bundle's encoder (or ``dim``): the vectors come from it."""
        encoder_dim(cls.name, bundle, dim)
        return cls(need(cls.name, params, "epsilon"),
                   params.get("calibration") or "vector", params.get("word_dropout") or 0.0)

    def privatize_vectors(self, vectors: np.ndarray, onehot: np.ndarray | None,
                          rng: np.random.Generator | None) -> tuple[np.ndarray, None]:
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


# -- its cost, floor and guarantee, registered in the registry's tables: ``shared.ledger``,
# ``shared.floor`` and ``shared.accounting`` find them there ---------------------------
@COST.register(Laplace)
def _cost(cls: Any, params: Mapping[str, Any], *, dim: int | None, **size: Any
          ) -> Cost:
    r = check_count("vector size", dim)
    eps = laplace_vector_epsilon(float(params["epsilon"]), params.get("calibration", "vector"),
                                 r)
    return Cost(cls.family, finite_cost(cls.name, eps))


@FLOOR.register(Laplace)
def _floor(mech: Laplace, bundle: EdgeBundle | None, *, threshold: float,
           dim: int | None, **_: Any) -> str | None:
    dim = vector_dim(mech, bundle, dim)
    eps = mech.epsilon
    head = msg.weak_head(msg.LAPLACE_WHAT.format(epsilon=eps))
    if not math.isfinite(laplace_vector_epsilon(eps, mech.calibration, dim)):
        return msg.LAPLACE_NOT_FINITE.format(head=head)
    b = mech.scale(dim)
    within = -math.expm1(-LAPLACE_STEP / b) if b > 0 else 1.0  # Pr[|noise| <= 2^-23]
    p = math.exp(dim * math.log(within)) if within > 0 else 0.0
    if p <= threshold:
        return None
    return msg.LAPLACE_ROUNDING.format(head=head, scale=b, share=msg.pct(p),
                                       floor=msg.pct(threshold))


@COMPUTABLE.register(Laplace)
def _computable(mech: Laplace, bundle: EdgeBundle | None, *, dim: int | None,
                float_dtype: str) -> None:
    b = mech.scale(vector_dim(mech, bundle, dim))  # inf if r/ε overflows
    if not math.isfinite(b) or 1.0 + b * TAIL > F32_MAX / 4.0:
        raise ValueError(msg.LAPLACE_TOO_SMALL.format(epsilon=mech.epsilon, scale=b))


@GUARANTEE.register(Laplace)
def _guarantee(mech: Laplace, bundle: EdgeBundle | None, *, dim: int | None,
               sample: int) -> dict[str, Any]:
    """DPNR (Lyu et al. 2020): ε' of Theorem 2 is what is published with word dropout.

    Dropout amplifies only for inputs that differ in one dropped unit (the edge drops
    whole words, each with all its word pieces, independently with probability μ); two
    arbitrary sentences get the whole-vector figure.
    """
    if dim is None and bundle is not None:
        dim = sentence_vector_dim(bundle)
    eps, mu = mech.epsilon, mech.word_dropout
    nominal = dropout_epsilon(eps, mu) if mu else eps
    g: dict[str, Any] = {"nominal": {"epsilon": nominal,
                     "statement": f"epsilon = {eps:g} per sentence vector (Lyu et al. 2020, "
                                  "DPNR Theorem 1)"
                                  + (f", word dropout mu={mu:g} gives ln((1-mu)e^eps+mu) "
                                     "(Theorem 2)" if mu else "")},
         "worst_case": {"epsilon": None}, "notes": []}
    whole = None
    if mech.calibration == "vector":
        whole = eps
        g["notes"].append("Noise scale r/epsilon covers the L1 sensitivity r of a vector in "
                          "[0,1]^r: the whole vector is epsilon-DP.")
    elif dim is None:
        g["notes"].append("Coordinate calibration: the whole vector is r*epsilon-DP; pass the "
                          "bundle (or dim) to get the number.")
    else:
        whole = laplace_vector_epsilon(eps, "coordinate", dim)
        g["worst_case"]["dim"] = dim
        g["notes"].append(f"Coordinate calibration (scale 1/epsilon, as published) protects one "
                          f"coordinate; a vector of r={dim} values in [0,1] has L1 sensitivity "
                          f"r, so the whole vector is only {whole:g}-DP.")
    g["worst_case"]["epsilon"] = whole
    g["worst_case"]["epsilon_scope"] = "any two sentences"
    if mu:
        if whole is not None:
            g["worst_case"]["word_level_epsilon"] = dropout_epsilon(whole, mu)
        g["notes"].append(
            f"Word dropout (mu={mu:g}) lowers the figure to ln((1-mu)e^eps+mu)"
            + (f" = {dropout_epsilon(whole, mu):.4g}" if whole is not None else "")
            + " only between sentences that differ in one word (the edge drops each word, "
            "with all its word pieces, with probability mu); any two sentences get the figure "
            "above.")
    return g
