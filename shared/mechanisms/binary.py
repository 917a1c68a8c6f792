"""Bit-vector mechanisms on a fixed-point encoding of a sentence vector.

OME (Lyu, Li, He, Xiao 2020, SIGIR, §3.1 and Algorithm 1): the vector is
z-scored, each value becomes 1 sign bit (1 = negative), ``int_bits`` integer
bits and ``frac_bits`` fraction bits (most significant first), and the r·l bits
go through randomized response with

    p_i = Pr[1 -> 1] = λ/(1+λ) for even i, 1/(1+λ^3) for odd i   (Eq. 2)
    q   = Pr[0 -> 1] = 1/(1 + λ e^(ε/(r·l)))                    (Eq. 3)

where i is the 0-based position in the whole r·l bit vector. The paper's
Theorem 1 claims ε-LDP; its proof lets even and odd positions cancel, and the
worst case over all bits is far larger (see ``shared.accounting``).

SUE and OUE (Wang et al. 2017, as described in §2.2) are offered as baselines
on the same bit encoding with sensitivity Δ = r·l: every bit may differ
between two inputs, so ε/Δ is spent per bit and the whole vector is ε-LDP.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import BaseModel, Field, model_validator

from shared import messages as msg
from shared.accounting import bit_flip_epsilon
from shared.arrays import STRICT, PosFloat
from shared.ledger import Cost, check_count, finite_cost
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


def sigmoid(x: float) -> float:
    """1/(1 + e^-x) without overflow for any finite x."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def z_score(vec: np.ndarray) -> np.ndarray:
    """(v - mean)/std per row; a constant row becomes zeros."""
    v = np.asarray(vec, dtype=np.float64)
    mu = v.mean(axis=-1, keepdims=True)
    sd = v.std(axis=-1, keepdims=True)
    return np.where(sd > 0, (v - mu) / np.where(sd > 0, sd, 1.0), 0.0)


class OMEParams(BaseModel):
    """OME: ε > 0, λ > 0, fixed-point layout (1 sign + int_bits + frac_bits)."""

    model_config = STRICT
    epsilon: PosFloat
    lam: PosFloat
    int_bits: Annotated[int, Field(strict=True, ge=0, le=29)] = 4
    frac_bits: Annotated[int, Field(strict=True, ge=0, le=29)] = 5

    @model_validator(mode="after")
    def _total(self) -> OMEParams:
        if not 1 <= self.int_bits + self.frac_bits <= 30:
            raise ValueError("int_bits + frac_bits must be between 1 and 30")
        return self

    @property
    def bits_per_value(self) -> int:
        """l = 1 + int_bits + frac_bits."""
        return 1 + self.int_bits + self.frac_bits


class SUEParams(BaseModel):
    """SUE and OUE (baselines without a payload): ε > 0 and the fixed-point layout."""

    model_config = STRICT
    epsilon: PosFloat
    int_bits: Annotated[int, Field(strict=True, ge=0, le=29)] = 4
    frac_bits: Annotated[int, Field(strict=True, ge=0, le=29)] = 5


class FixedPointBits(BaseMechanism):
    """Sign + integer + fraction bit encoding shared by OME, SUE and OUE."""

    name = ""
    payload_kind = PayloadKind.BITS
    family = "randomized-response"
    epsilon: float  # each subclass's own

    def __init__(self, dim: int, int_bits: int = 4, frac_bits: int = 5):
        self.dim = positive_int("dim", dim)
        self.int_bits = positive_int("int_bits", int_bits, minimum=0)
        self.frac_bits = positive_int("frac_bits", frac_bits, minimum=0)
        if self.int_bits + self.frac_bits == 0 or self.int_bits + self.frac_bits > 30:
            raise ValueError("int_bits + frac_bits must be between 1 and 30")
        self.bits_per_value = 1 + self.int_bits + self.frac_bits
        self.n_bits = self.dim * self.bits_per_value
        self.max_abs = 2.0**self.int_bits - 2.0**-self.frac_bits

    def encode(self, vec: np.ndarray) -> np.ndarray:
        """z-score ``vec`` (dim,) or (b, dim), clip to the representable range, encode.

        Returns uint8 bits of shape (dim·l,) or (b, dim·l).
        """
        v = np.asarray(vec)
        if v.ndim not in (1, 2):
            raise ValueError(f"vec must have shape ({self.dim},) or (b, {self.dim}), got {v.shape}")
        v = finite_array("vec", v, ndim=v.ndim, dim=self.dim)
        z = z_score(v)
        mag = np.minimum(np.abs(z), self.max_abs)
        fixed = np.floor(mag * 2.0**self.frac_bits).astype(np.int64)
        shifts = np.arange(self.int_bits + self.frac_bits - 1, -1, -1)
        mag_bits = (fixed[..., None] >> shifts) & 1
        sign = (z < 0).astype(np.int64)[..., None]
        bits = np.concatenate([sign, mag_bits], axis=-1).astype(np.uint8)
        return bits.reshape(*z.shape[:-1], self.n_bits)

    def decode(self, bits: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`encode` up to clipping and the fraction step (z-scored values)."""
        b = np.asarray(bits, dtype=np.int64)
        b = b.reshape(*b.shape[:-1], self.dim, self.bits_per_value)
        weights = 2.0 ** np.arange(self.int_bits - 1, -self.frac_bits - 1, -1)
        mag: np.ndarray = (b[..., 1:] * weights).sum(axis=-1)
        return np.where(b[..., 0] == 1, -mag, mag)

    def bit_probabilities(self) -> tuple[np.ndarray, float]:
        """(p, q): Pr[1 -> 1] for every bit position, and Pr[0 -> 1]."""
        raise NotImplementedError

    def perturb(self, bits: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Randomized response on every bit; ``bits`` is (n_bits,) or (b, n_bits) of 0/1."""
        b = np.asarray(bits)
        if b.shape[-1:] != (self.n_bits,) or b.ndim not in (1, 2):
            raise ValueError(f"bits must have {self.n_bits} values in the last axis, got {b.shape}")
        if b.size and not np.isin(b, (0, 1)).all():
            raise ValueError("bits must be 0 or 1")
        p, q = self.bit_probabilities()
        u = resolve_rng(rng).random(b.shape)
        return np.where(b == 1, u < p, u < q).astype(np.uint8)

    def privatize(self, vec: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """encode then perturb."""
        return self.perturb(self.encode(vec), rng)

    def privatize_vectors(self, vectors: np.ndarray, onehot: np.ndarray | None,
                          rng: np.random.Generator | None) -> tuple[np.ndarray, None]:
        return self.privatize(vectors, rng), None


class OME(FixedPointBits):
    """Optimized Multiple Encoding (Theorem 1)."""

    name = "ome"
    Params = OMEParams
    param_help = {"epsilon": "epsilon > 0", "lam": "randomized-response factor lambda > 0"}
    fixed_params = frozenset({"int_bits", "frac_bits"})  # the edge's layout: 1 + 4 + 5 bits

    def __init__(self, epsilon: float, lam: float, dim: int, int_bits: int = 4, frac_bits: int = 5):
        super().__init__(dim, int_bits, frac_bits)
        self.epsilon = positive("epsilon", epsilon)
        self.lam = positive("lam", lam)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], bundle: EdgeBundle | None = None, *,
                    dim: int | None = None, secret: int | None = None) -> OME:
        return cls(need(cls.name, params, "epsilon"), need(cls.name, params, "lam"),
                   encoder_dim(cls.name, bundle, dim), params.get("int_bits", 4),
                   params.get("frac_bits", 5))

    @classmethod
    def values_per_dim(cls, params: Mapping[str, Any]) -> int:
        """l = 1 + int_bits + frac_bits bits per coordinate."""
        return 1 + int(params.get("int_bits", 4)) + int(params.get("frac_bits", 5))

    @property
    def params(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "lam": self.lam,
            "int_bits": self.int_bits,
            "frac_bits": self.frac_bits,
        }

    def flip_probabilities(self) -> tuple[float, float, float]:
        """(p_even, p_odd, q) of Eq. 2-3."""
        # λ/(1+λ), 1/(1+λ^3), 1/(1+λe^(ε/rl)) written as logistic functions of ln λ:
        # the same numbers, and no overflow for a huge λ or ε
        log_lam = math.log(self.lam)
        p_even = sigmoid(log_lam)
        p_odd = sigmoid(-3.0 * log_lam)
        q = sigmoid(-(log_lam + self.epsilon / self.n_bits))
        return p_even, p_odd, q

    def bit_probabilities(self) -> tuple[np.ndarray, float]:
        p_even, p_odd, q = self.flip_probabilities()
        p = np.where(np.arange(self.n_bits) % 2 == 0, p_even, p_odd)
        return p, q


class SUE(FixedPointBits):
    """Symmetric unary-style randomized response: p = e^a/(1+e^a), q = 1/(1+e^a), a = ε/(r·l)."""

    name = "sue"
    Params = SUEParams

    def __init__(self, epsilon: float, dim: int, int_bits: int = 4, frac_bits: int = 5):
        super().__init__(dim, int_bits, frac_bits)
        self.epsilon = positive("epsilon", epsilon)

    @property
    def params(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "int_bits": self.int_bits, "frac_bits": self.frac_bits}

    def bit_probabilities(self) -> tuple[np.ndarray, float]:
        a = self.epsilon / self.n_bits
        return np.full(self.n_bits, sigmoid(a)), sigmoid(-a)


class OUE(SUE):
    """Optimized unary-style randomized response: p = 1/2, q = 1/(1+e^a), a = ε/(r·l)."""

    name = "oue"

    def bit_probabilities(self) -> tuple[np.ndarray, float]:
        return np.full(self.n_bits, 0.5), sigmoid(-self.epsilon / self.n_bits)


# -- its cost, floor and guarantee, registered in the registry's tables: ``shared.ledger``,
# ``shared.floor`` and ``shared.accounting`` find them there ---------------------------
@lru_cache(maxsize=256)
def _bits_epsilon(epsilon: float, lam: float, dim: int, int_bits: int, frac_bits: int) -> float:
    p, q = OME(epsilon, lam, dim, int_bits, frac_bits).bit_probabilities()
    return bit_flip_epsilon(p, q)


@COST.register(OME)
def _ome_cost(cls: Any, params: Mapping[str, Any], *, dim: int | None, **size: Any) -> Cost:
    r = check_count("vector size", dim)
    eps = _bits_epsilon(float(params["epsilon"]), float(params["lam"]), r,
                        int(params.get("int_bits", 4)), int(params.get("frac_bits", 5)))
    return Cost(cls.family, finite_cost(cls.name, eps))


@COST.register(FixedPointBits)
def _bits_cost(cls: Any, params: Mapping[str, Any], *, dim: int | None, **size: Any
               ) -> Cost:
    """SUE, OUE: the worst case over their bits (objects only: they have no payload)."""
    mech = cls(float(params["epsilon"]), check_count("vector size", dim),
               int(params.get("int_bits", 4)), int(params.get("frac_bits", 5)))
    p, q = mech.bit_probabilities()
    return Cost(cls.family, finite_cost(cls.name, bit_flip_epsilon(p, q)))


@FLOOR.register(FixedPointBits)
def _floor(mech: FixedPointBits, bundle: EdgeBundle | None, *, threshold: float,
           dim: int | None, **_: Any) -> str | None:
    p, q = mech.bit_probabilities()
    params = msg.BITS_PARAM_JOIN.join(msg.BITS_PARAM.format(name=k, value=v)
                                      for k, v in mech.params.items() if k in ("epsilon", "lam"))
    head = msg.weak_head(msg.BITS_WHAT.format(mechanism=mech.name, params=params))
    if not math.isfinite(bit_flip_epsilon(p, q)):
        return msg.BITS_NOT_FINITE.format(head=head)
    det = np.minimum(np.maximum(p, 1.0 - p), max(q, 1.0 - q))
    prob = math.exp(float(np.log(det).sum()))
    if prob <= threshold:
        return None
    return msg.BITS_FIXED.format(head=head, share=msg.pct(prob), n_bits=mech.n_bits,
                                 floor=msg.pct(threshold))


@GUARANTEE.register(FixedPointBits)
def _guarantee(mech: FixedPointBits, bundle: EdgeBundle | None, *, dim: int | None,
               sample: int) -> dict[str, Any]:
    p, q = mech.bit_probabilities()
    worst = bit_flip_epsilon(p, q)
    g: dict[str, Any] = {"nominal": {"epsilon": mech.epsilon},
         "worst_case": {"epsilon": worst, "n_bits": mech.n_bits}, "notes": []}
    if isinstance(mech, OME):
        p_even, p_odd, q = mech.flip_probabilities()
        g["nominal"]["statement"] = "epsilon-LDP claimed (Lyu et al. 2020, OME Theorem 1)"
        g["worst_case"].update({"p_even": p_even, "p_odd": p_odd, "q": q})
        g["notes"].append(
            f"The published proof lets even and odd bit positions cancel. Any bit may change "
            f"between two inputs; summed over all {mech.n_bits} bits the worst case is "
            f"epsilon = {worst:.1f}, not {mech.epsilon:g}.")
    else:
        g["notes"].append(f"Randomized response with epsilon/{mech.n_bits} per bit; computed bit "
                          f"by bit, the whole vector is {worst:.3g}-LDP (at most the nominal "
                          "epsilon).")
    return g
