"""What a request costs, recomputed on the server (``shared.ledger``) from the mechanism and
parameters of its task or model and from the payloads received, never from a figure the
client sends; and the charge of predictions (``store.charge_writer``) with its metrics.

dχ costs need D, the largest distance on the bundle's table: from the bundle when the server
has it, else from the model's published guarantee (worst-case ε per token = η·D); when
neither is known the request cannot be accounted for and is refused (503), never passed
uncounted.

No charge without an answer. A prediction is admitted to its model's queue before it is
charged (``ServedModels.admit``, ``serving/hot_swap.py``): one refused for load (429), or larger than the queue (413), is
never charged. Its charge then commits on the charge writer's thread while the model runs,
and the answer waits for the commit (no request is answered whose charge did not commit).
When no answer comes after the charge committed (the client went away, the forward failed
or gave non-finite scores, the queue timed out, the request was cancelled), the charge is refunded in the same store,
with an audit row (``store.budgets.refund``, :func:`unanswered`). Why a race cannot pass a
cap: the charge's check is the only place spend is admitted, and a refund only ever takes
back a charge already committed, after that commit; meanwhile a concurrent request sees the
ledger with the charge in it (more spent, so it may be refused where it would have fit,
never admitted where it would not). A crash between the charge and its refund leaves the
charge: the ledger over-counts, never under-counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cloud_api import metrics
from cloud_api.errors import NonFiniteScores, NotFound, Overloaded, Unavailable
from cloud_api.serving.payload_queue import ClientGone
from cloud_api.store import budgets
from shared import ledger
from shared.accounting import bundle_diameter
from shared.ledger import Cost

_DIAMETERS: dict[str, float] = {}


def _diameter_sync(bundles, bundle_id: str) -> float | None:
    if bundle_id not in _DIAMETERS:
        try:
            _DIAMETERS[bundle_id] = bundle_diameter(bundles.get(bundle_id))
        except NotFound:
            return None
    return _DIAMETERS[bundle_id]


def _from_guarantee(info: dict) -> float | None:
    """D from a model's worst-case ε per token (η·D) and its η."""
    wc = (info.get("guarantee") or {}).get("worst_case") or {}
    eps, eta = wc.get("epsilon"), (info.get("params") or {}).get("eta")
    if isinstance(eps, int | float) and isinstance(eta, int | float) and eta > 0:
        return float(eps) / float(eta)
    return None


def payloads_cost(mechanism: str, params: dict, payloads: Sequence,
                  diameter: float | None) -> Cost:
    """The summed cost of ``payloads`` under ``mechanism`` and ``params`` (already checked to
    be the payloads' own)."""
    if ledger.family_of(mechanism) == "dchi" and diameter is None:
        raise Unavailable(f"the payloads of this {mechanism} model cannot be accounted for: "
                          "its bundle is not on this server", retry_after=60)
    cost = ledger.batch_cost(payloads, mechanism, params, diameter)
    assert cost is not None, "no payloads to price"  # a request holds at least one
    return cost


def records_cost(task, recs: Sequence, bundle) -> Cost:
    """The cost of a records request of ``task`` (its payloads, its bundle's D)."""
    d = None
    if ledger.family_of(task.mechanism) == "dchi":
        if task.bundle_id not in _DIAMETERS:
            _DIAMETERS[task.bundle_id] = bundle_diameter(bundle)
        d = _DIAMETERS[task.bundle_id]
    return payloads_cost(task.mechanism, task.params, [r.payload for r in recs], d)


def charge_of(settings, key_id: str, device_id: str, cost: Cost) -> budgets.Charge:
    """The charge of ``cost`` to the key's ledger and its device's, with the default caps."""
    return budgets.Charge(key_id, device_id, cost, settings.default_budget,
                          settings.default_device_budget)


def counted(cost: Cost, route: str) -> None:
    """Metrics of a charge that went through."""
    if cost.epsilon is not None:
        metrics.PRIVACY_SPENT.labels(family=cost.family, route=route).inc(cost.epsilon)
    metrics.PRIVACY_PAYLOADS.labels(family=cost.family, route=route).inc(cost.sends)


async def price_prediction(state, key_id: str, device_id: str | None, model_id: str,
                           payloads: Sequence) -> tuple[budgets.Charge, object]:
    """Check ``payloads`` against the model (a mismatched payload is refused, not charged),
    then price them: the charge to make (422 for a malformed X-Device-Id), and the token of
    the version that checked them (``ServedModels.predict``'s ``checked``)."""
    device = budgets.check_device_id(device_id)
    served_models = state.served_models
    checked = served_models.check(model_id, payloads)
    info = served_models.info_of(model_id)
    d = None
    if ledger.family_of(info["mechanism"]) == "dchi":
        d = _DIAMETERS.get(info["bundle_id"])
        if d is None:  # once per bundle: off the event loop (it may load the bundle)
            d = await asyncio.to_thread(_diameter_sync, state.bundles, info["bundle_id"])
        d = d if d is not None else _from_guarantee(info)
    cost = payloads_cost(info["mechanism"], info["params"], payloads, d)
    return charge_of(state.settings, key_id, device, cost), checked


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, ClientGone):
        return "client-gone"
    if isinstance(exc, Overloaded):
        return "overloaded"
    if isinstance(exc, Unavailable):
        return "unavailable"
    if isinstance(exc, NonFiniteScores):
        return "non-finite"
    return "forward-failed"


async def unanswered(writer, pending: asyncio.Future, ch: budgets.Charge,
                     exc: BaseException) -> None:
    """A prediction that gets no answer (``exc``): once its charge has committed, refund it
    (the writer's thread, with an audit row). Raises BudgetExhausted when the charge was
    refused: the 403 is then the answer. A cancelled request does not wait."""
    reason = _reason(exc)

    def refund_when_committed(fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is None:
            writer.refund(ch, reason)
            metrics.PRIVACY_REFUNDS.labels(reason=reason).inc()

    if isinstance(exc, asyncio.CancelledError) or not isinstance(exc, Exception):
        pending.add_done_callback(refund_when_committed)
        return
    try:
        await pending
    except budgets.BudgetExhausted:
        metrics.BUDGET_EXHAUSTED.labels(route="predict").inc()
        raise
    except Exception:  # noqa: BLE001 - not committed (database down): nothing to refund
        return
    refund_when_committed(pending)


async def settle_prediction(pending: asyncio.Future, cost: Cost) -> budgets.Charged:
    """The committed charge of :meth:`ChargeWriter.submit`'s future, with its metrics
    (BudgetExhausted: 403)."""
    try:
        charged = await pending
    except budgets.BudgetExhausted:
        metrics.BUDGET_EXHAUSTED.labels(route="predict").inc()
        raise
    counted(cost, "predict")
    return charged
