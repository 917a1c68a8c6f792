"""The privacy budget ledger's arithmetic: what one privatization costs, how costs compose,
and whether a cost fits a cap. Pure functions, no I/O; the device ledger
(``edge_agent.budget.ledger``) and the server's (``cloud_api.store.budgets``) store what
these compute.

A cost is computed here from the mechanism, its parameters and the payload (its token
count, its vector size), never taken from a caller. Each family composes in the units of
its own guarantee (sequential composition: the losses of adaptively chosen mechanisms
add up, Dwork & Roth 2014 Thm 3.16; for metric DP η1·d followed by η2·d is (η1+η2)·d,
Chatzikokolakis et al. 2013):

* ``dchi`` (dchi-text, dchi-embedding): a sentence of n tokens is (η·d)-private per token
  and the tokens add up (Qu et al. 2021 §3.2): the metric total η·n, and its worst-case
  ε = η·n·D with D = 2 max||φ|| over the bundle's regular table (no two tokens are further
  apart; the figure ``shared.accounting`` reports per token). Under a token policy
  (``shared.policy``) the public words of a sentence have no guarantee: n counts the other
  tokens, and the public ones are counted beside them (``public``), never charged. Only the
  device knows which tokens were public; a server, which must not be told, charges every
  token of a payload (a bound on the device's charge).
* ``laplace``: the whole-vector ε (ε with calibration "vector", r·ε with "coordinate";
  word dropout only helps sentences that differ in one word, so it is not counted).
* ``randomized-response`` (ome, and SUE/OUE objects): the worst-case ε summed over the bits
  (``shared.accounting.bit_flip_epsilon``), not OME's nominal ε.
* ``texthide``: no differential-privacy guarantee, so no ε: its sends are counted.
* ``none``: no privatization at all: its sends are counted.

The total across families is the sum of the worst-case ε (each guarantee read as ε between
any two inputs). The filter (Rogers et al. 2016, "privacy filters"): with spent S and cap
C, a cost c is admitted iff S + c <= C. A cost without an ε (texthide, none) fits only when
there is no cap, and a cap of 0 admits nothing. NaN, negative and infinite costs and caps
are refused with ValueError.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from shared import messages as msg
from shared.mechanisms import registry
from shared.mechanisms.registry import as_mechanism


@dataclass(frozen=True)
class BudgetFamily:
    """A budget family: the costs of its mechanisms compose in the units of its guarantee
    (module docstring). ``epsilon``: its costs carry a worst-case ε (texthide and none only
    count their sends); ``metric``: it also counts the dχ metric total Σ η·n and the tokens;
    ``memo``: a repeat of the same input is sent again from the device's memo at no cost
    (RAPPOR's lesson, ``edge_agent.budget.memo``); TextHide's and none's are never kept."""

    name: str
    epsilon: bool = True
    metric: bool = False
    memo: bool = True


_FAMILIES: dict[str, BudgetFamily] = {}


def register_family(family: BudgetFamily) -> BudgetFamily:
    """Add a budget family (a plugin mechanism with a guarantee of a new kind registers its
    own); the ledgers of both edges and the server's count it without a migration."""
    if _FAMILIES.get(family.name, family) != family:
        raise ValueError(f"budget family {family.name!r} is registered already, otherwise")
    _FAMILIES[family.name] = family
    return family


for _f in (BudgetFamily("dchi", metric=True), BudgetFamily("laplace"),
           BudgetFamily("randomized-response"),
           BudgetFamily("texthide", epsilon=False, memo=False),
           BudgetFamily("none", epsilon=False, memo=False)):
    register_family(_f)

FAMILIES = tuple(_FAMILIES)  # the built-in families, in the order the views list them
NO_EPSILON = tuple(f.name for f in _FAMILIES.values() if not f.epsilon)


def families() -> tuple[BudgetFamily, ...]:
    """Every registered budget family (the built-in ones first)."""
    return tuple(_FAMILIES.values())


def budget_family(name: str) -> BudgetFamily:
    """The family registered as ``name``; ValueError otherwise."""
    try:
        return _FAMILIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown budget family {name!r}") from None


def has_epsilon(family: str) -> bool:
    """Whether costs of ``family`` carry a worst-case ε (ValueError for an unknown one)."""
    return budget_family(family).epsilon


@dataclass(frozen=True)
class Cost:
    """The cost of one privatization (one payload), or of several added up.

    ``epsilon``: worst-case ε (None: the mechanism has no ε to count); ``metric``: the dχ
    metric total Σ η·n; ``tokens``: dχ tokens charged; ``public``: dχ tokens sent under a
    token policy (public words: no guarantee, not charged); ``sends``: payloads."""

    family: str
    epsilon: float | None
    metric: float = 0.0
    tokens: int = 0
    sends: int = 1
    eta: float | None = None  # dχ: the η of this privatization
    public: int = 0

    def __post_init__(self) -> None:
        if (self.epsilon is None) == has_epsilon(self.family):
            what = "has no" if self.epsilon is not None else "needs an"
            raise ValueError(f"family {self.family} {what} epsilon")
        if self.epsilon is not None:
            check_amount("cost", self.epsilon)
        check_amount("dχ metric total", self.metric)


def check_amount(name: str, value: Any) -> float:
    """``value`` as a float if it is a finite number >= 0, else ValueError naming ``name``
    (NaN, infinities, negatives, booleans and non-numbers are refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must be a number, got NaN")
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {v:g}")
    return v


def check_cap(cap: Any) -> float | None:
    """A cap as stored: None (no cap) or a finite number >= 0 (ValueError otherwise)."""
    return None if cap is None else check_amount("cap", cap)


# -- the cost of one privatization -----------------------------------------------------------


def family_of(mechanism: str) -> str:
    """The budget family of the mechanism named ``mechanism`` (its class's ``family``)."""
    try:
        fam = registry.get(mechanism).family
    except registry.UnknownMechanism:
        raise ValueError(f"no budget family for mechanism {mechanism!r}") from None
    if fam not in _FAMILIES:
        raise ValueError(f"mechanism {mechanism}: unknown budget family {fam!r}")
    return fam


def cost(mechanism: str, params: Mapping[str, Any], *, tokens: int | None = None,
         dim: int | None = None, diameter: float | None = None, public: int = 0) -> Cost:
    """The cost of one payload of ``mechanism`` with ``params``: ``tokens`` (dχ: the
    payload's n), ``dim`` (laplace and ome: the payload's vector size r), ``diameter``
    (dχ: D of the bundle's table, :func:`bundle_diameter`), ``public`` (dχ under a token
    policy: how many of the n tokens are public words, counted and not charged).
    ValueError when the worst-case ε is not a finite number (such a privatization cannot be
    counted)."""
    family_of(mechanism)
    extra = {"public": public} if public else {}  # a plugin's cost function may not take it
    # the registry's COST functions return a Cost (the registry cannot name the class here)
    return cast(Cost, registry.get(mechanism).cost_of(params, tokens=tokens, dim=dim,
                                                      diameter=diameter, **extra))


# -- the cost of each mechanism: in its own module, registered in the registry's ``COST``
# table (``mechanism.cost(...)`` finds it) ----------------------------------------------------
def counted(cls: Any, params: Mapping[str, Any], **size: Any) -> Cost:
    """The cost of a mechanism without an ε (texthide, none): its sends are counted."""
    return Cost(cls.family, None)




def mechanism_cost(mechanism: Any, *, tokens: int | None = None, dim: int | None = None,
                   diameter: float | None = None) -> Cost:
    """:func:`cost` of a ``shared.mechanisms`` object (or the name "none"), SUE and OUE
    too: ``mechanism.cost(...)``."""
    return cast(Cost, as_mechanism(mechanism).cost(tokens=tokens, dim=dim, diameter=diameter))


def payload_size(payload: Any) -> dict[str, int]:
    """What a payload's cost depends on, read from its arrays: ``tokens`` (token kinds)
    or ``dim`` (vector kinds: r values; OME: its bits over 1 + int_bits + frac_bits)."""
    if hasattr(payload, "n_tokens"):
        return {"tokens": int(payload.n_tokens)}
    n = int(getattr(payload, payload.array_field).shape[0])
    return {"dim": n // getattr(payload.params, "bits_per_value", 1)}  # OME: l bits a value


def payload_cost(payload: Any, diameter: float | None = None, *,
                 mechanism: str | None = None, params: Mapping[str, Any] | None = None) -> Cost:
    """The cost of a ``shared.payload`` payload; ``mechanism`` and ``params`` default to its
    own (a server passes its task's or model's, which the payload was checked against)."""
    mech = mechanism if mechanism is not None else payload.mechanism
    par = params if params is not None else payload.params.model_dump()
    return cost(mech, par, diameter=diameter, **payload_size(payload))


def batch_cost(payloads: Iterable[Any], mechanism: str, params: Mapping[str, Any],
               diameter: float | None = None) -> Cost | None:
    """The summed cost of ``payloads`` all under ``mechanism`` and ``params`` (a request
    checked against one task or model); None for no payloads. The same figure as
    :func:`total` of their :func:`payload_cost` (up to float rounding), in one call per
    distinct payload size: dχ costs add up linearly in the tokens (η·D·Σn), the others
    depend only on the payload's size (r for the vector mechanisms)."""
    sizes: dict[tuple[tuple[str, int], ...], int] = {}
    n = 0
    if family_of(mechanism) == "dchi":
        # each payload's n_tokens, read without the property (the property dominated the
        # pricing of a large request in bench/records.py)
        shapes = [getattr(p, p.array_field).shape for p in payloads]
        if not shapes:
            return None
        c = cost(mechanism, params, tokens=int(sum([s[0] for s in shapes])),
                 diameter=diameter)
        return Cost(c.family, c.epsilon, c.metric, c.tokens, len(shapes), c.eta)
    for p in payloads:
        size = tuple(payload_size(p).items())  # (("dim", r),) or (("tokens", n),)
        sizes[size] = sizes.get(size, 0) + 1
        n += 1
    if n == 0:
        return None
    if not has_epsilon(family_of(mechanism)):
        return Cost(family_of(mechanism), None, sends=n)
    each = [(cost(mechanism, params, **dict(size)), k) for size, k in sizes.items()]
    eps = math.fsum(cast(float, c.epsilon) * k for c, k in each)
    return Cost(family_of(mechanism), finite_cost(mechanism, eps), sends=n,
                tokens=sum(c.tokens * k for c, k in each))


def check_count(name: str, n: Any) -> int:
    """``n`` if it is an integer >= 0 (a token count, a vector size), else ValueError."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {n!r}")
    return n


def finite_cost(mechanism: str, value: float) -> float:
    """A worst-case ε as a float, or the ledger's refusal of one that is not a finite
    number >= 0 (such a privatization cannot be counted)."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(msg.LEDGER_NOT_FINITE.format(mechanism=mechanism, epsilon=value))
    return float(value)


# -- composition ------------------------------------------------------------------------------
@dataclass
class FamilySpend:
    """What one family has spent: worst-case ε (None for the families without one), dχ
    metric total and tokens, payloads sent."""

    epsilon: float | None = 0.0
    metric: float = 0.0
    tokens: int = 0
    sends: int = 0
    public: int = 0  # dχ: public words sent under a token policy (no guarantee, not charged)


@dataclass
class Spend:
    """Costs composed: per family, and one worst-case ε total across them."""

    families: dict[str, FamilySpend] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return math.fsum(f.epsilon for f in self.families.values() if f.epsilon is not None)

    @property
    def sends(self) -> int:
        return sum(f.sends for f in self.families.values())

    def add(self, c: Cost) -> Spend:
        f = self.families.setdefault(c.family, FamilySpend(
            0.0 if has_epsilon(c.family) else None))
        if c.epsilon is not None:
            f.epsilon = (f.epsilon or 0.0) + c.epsilon
        f.metric += c.metric
        f.tokens += c.tokens
        f.sends += c.sends
        f.public += c.public
        return self


def compose(costs: Iterable[Cost]) -> Spend:
    """Sequential composition: the sum per family, and :attr:`Spend.total`."""
    spend = Spend()
    for c in costs:
        spend.add(c)
    return spend


def total(costs: Iterable[Cost]) -> Cost | None:
    """The costs of one batch (one family) added into one :class:`Cost`; None if empty."""
    costs = list(costs)
    if not costs:
        return None
    fams = {c.family for c in costs}
    if len(fams) != 1:
        raise ValueError(f"one family per batch, got {sorted(fams)}")
    fam = fams.pop()
    eps = math.fsum(cast(float, c.epsilon) for c in costs) if has_epsilon(fam) else None
    etas = {c.eta for c in costs}
    return Cost(fam, eps, metric=math.fsum(c.metric for c in costs),
                tokens=sum(c.tokens for c in costs), sends=sum(c.sends for c in costs),
                eta=etas.pop() if len(etas) == 1 else None,
                public=sum(c.public for c in costs))


# -- the filter -------------------------------------------------------------------------------
def fits(spent: float, epsilon: float | None, cap: float | None) -> bool:
    """The privacy filter: may a cost of ``epsilon`` (None: no ε) be spent on top of
    ``spent`` under ``cap`` (None: no cap)? Everything fits without a cap; with one, a
    cost without an ε never does, a cap of 0 admits nothing, and otherwise
    spent + epsilon <= cap."""
    spent = check_amount("spent", spent)
    if epsilon is not None:
        epsilon = check_amount("cost", epsilon)
    cap = check_cap(cap)
    if cap is None:
        return True
    if epsilon is None or cap == 0:
        return False
    return spent + epsilon <= cap


def remaining(spent: float, cap: float | None) -> float | None:
    """What is left under ``cap`` (None without a cap; never below 0)."""
    if cap is None:
        return None
    return max(0.0, check_amount("cap", cap) - check_amount("spent", spent))
