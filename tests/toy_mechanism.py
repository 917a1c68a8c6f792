"""A mechanism that is not in the product: k-ary randomized response on word pieces.

It shows what adding a mechanism takes: this one file (the class, its cost, floor and
guarantee) and one registry line -- here the entry point of a test-only distribution
(``tests/cloud_api/test_plugin_mechanism.py`` writes its ``entry_points.txt``), in the
product a ``register(...)`` line in ``shared/mechanisms/__init__.py``.

Each token x is kept with probability p = e^ε / (e^ε + V - 1), else replaced by one of the
other V - 1 regular tokens, uniformly (Kairouz, Oh, Viswanath 2014, k-RR): every output
token is at most e^ε times likelier under one input token than under another, so a payload
of n tokens is (n·ε)-LDP. Outputs are regular tokens only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel

from shared.arrays import STRICT, PosFloat
from shared.ledger import Cost
from shared.mechanisms.checks import positive
from shared.mechanisms.registry import (
    COST,
    FLOOR,
    GUARANTEE,
    BaseMechanism,
    PayloadKind,
    need,
)
from shared.rng import resolve_rng


class ToyRRParams(BaseModel):
    model_config = STRICT
    epsilon: PosFloat


class ToyRR(BaseMechanism):
    name = "toy-rr"
    Params = ToyRRParams
    payload_kind = PayloadKind.TOKENS
    family = "randomized-response"

    def __init__(self, bundle, epsilon: float):
        self.epsilon = positive("epsilon", epsilon)
        self.bundle = bundle
        self.regular = np.sort(np.asarray(bundle.regular_ids, dtype=np.int64))

    @property
    def params(self) -> dict:
        return {"epsilon": self.epsilon}

    @classmethod
    def from_params(cls, params, bundle=None, *, dim=None, secret=None) -> ToyRR:
        if bundle is None:
            raise ValueError(f"{cls.name} needs the bundle (its regular tokens)")
        return cls(bundle, need(cls.name, params, "epsilon"))

    def keep_probability(self) -> float:
        """e^ε / (e^ε + V - 1), as a logistic function (no overflow for a large ε)."""
        v = self.regular.size
        return 1.0 / (1.0 + (v - 1) * math.exp(-self.epsilon))

    def privatize_tokens(self, ids, bundle, rng) -> np.ndarray:
        rng = resolve_rng(rng)
        ids = np.asarray(ids, dtype=np.int64)
        v = self.regular.size
        pos = np.minimum(np.searchsorted(self.regular, ids), v - 1)
        regular = self.regular[pos] == ids
        keep = regular & (rng.random(ids.size) < self.keep_probability())
        other = rng.integers(0, v - 1, size=ids.size)  # one of the other V - 1 tokens
        other = np.where(regular, other + (other >= pos), rng.integers(0, v, size=ids.size))
        return np.where(keep, ids, self.regular[other])


@COST.register(ToyRR)
def _cost(cls: type, params: Mapping[str, Any], *, tokens: int | None, **size: Any) -> Cost:
    n = int(tokens or 0)
    return Cost(cls.family, float(params["epsilon"]) * n, tokens=n)


@FLOOR.register(ToyRR)
def _floor(mech: ToyRR, bundle, *, threshold: float, dim: int | None) -> str | None:
    p = mech.keep_probability()
    if p <= threshold:
        return None
    return (f"{mech.name} epsilon={mech.epsilon:g} is weaker than the privacy floor: "
            f"{100 * p:.2f}% of tokens come back unchanged")


@GUARANTEE.register(ToyRR)
def _guarantee(mech: ToyRR, bundle, *, dim: int | None, sample: int) -> dict:
    return {"nominal": {"epsilon": mech.epsilon, "statement": "epsilon-LDP per token (k-RR)"},
            "worst_case": {"epsilon": mech.epsilon, "epsilon_scope": "per token"},
            "notes": ["A sentence of n tokens is (n x epsilon)-LDP."]}
