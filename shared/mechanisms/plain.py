"""No privatization: the Null-privacy baseline, named explicitly so that it is never the
result of a missing setting. Its payloads carry the plain word-piece ids, which the
server can read; the edge sends them only with ``--allow-none`` and the server accepts
them only with ``PRIVBERT_ALLOW_NONE=1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel

from shared import messages as msg
from shared.arrays import STRICT
from shared.ledger import counted
from shared.mechanisms.registry import COST, FLOOR, GUARANTEE, BaseMechanism, PayloadKind

if TYPE_CHECKING:
    from shared.bundle import EdgeBundle


class NoneParams(BaseModel):
    """No privatization (Null-privacy baseline): no parameters."""

    model_config = STRICT


class NoPrivacy(BaseMechanism):
    """The identity on token ids; ``private`` is False (no guarantee, no floor to judge:
    it is the baseline that the floor compares the others with)."""

    name = "none"
    Params = NoneParams
    payload_kind = PayloadKind.TOKENS
    family = "none"
    private = False
    has_epsilon = False
    edge_options = frozenset({"allow_none"})

    @property
    def params(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_params(cls, params: Mapping[str, Any], bundle: EdgeBundle | None = None, *,
                    dim: int | None = None, secret: int | None = None) -> NoPrivacy:
        return cls()

    def privatize_tokens(self, ids: np.ndarray, bundle: EdgeBundle,
                         rng: np.random.Generator | None) -> np.ndarray:
        return ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoPrivacy)

    def __hash__(self) -> int:
        return hash(NoPrivacy)

    def __repr__(self) -> str:
        return "NoPrivacy()"


# -- its cost, floor and guarantee, registered in the registry's tables: ``shared.ledger``,
# ``shared.floor`` and ``shared.accounting`` find them there ---------------------------
COST.register(NoPrivacy)(counted)  # no ε: its sends are counted


@FLOOR.register(NoPrivacy)
def _floor(mech: NoPrivacy, bundle: EdgeBundle | None, *, threshold: float,
           dim: int | None, **_: Any) -> str | None:
    return msg.NONE_REFUSED


@GUARANTEE.register(NoPrivacy)
def _guarantee(mech: NoPrivacy, bundle: EdgeBundle | None, *, dim: int | None,
               sample: int) -> dict[str, Any]:
    return {"nominal": {"epsilon": math.inf}, "worst_case": {"epsilon": math.inf},
            "notes": ["No privatization: the server can read the text (Null-privacy "
                      "baseline only)."]}
