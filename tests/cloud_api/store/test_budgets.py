"""The server's privacy budget ledgers on SQLite and a real PostgreSQL: the SQL filter decides
as shared.ledger.fits does, concurrent charges never pass a cap, a refused records request
stores nothing, a replay is charged once, devices, caps and resets."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import func, select

from cloud_api.errors import InvalidRequest, NotFound
from cloud_api.store import budget_admin, budgets
from cloud_api.store import records as store
from cloud_api.store.tables import records as records_table
from shared import ledger
from shared.accounting import bundle_diameter
from shared.arrays import Limits
from shared.mechanisms import DChiText
from tests.cloud_api.store.conftest import ETA, privatize, race, raw_records


def laplace(eps: float) -> ledger.Cost:
    return ledger.cost("laplace", {"epsilon": eps}, dim=4)  # worst-case epsilon eps


def charge(db, key: str, cost: ledger.Cost, device: str = "", default=None):
    with db.begin(write=True) as conn:
        return budgets.charge(conn, budgets.Charge(key, device, cost, default))


def test_the_sql_filter_decides_as_shared_ledger_fits(db):
    """A random walk of costs (some hitting the cap exactly) on one capped ledger: every
    decision and the spent total are those of shared.ledger.fits in Python (exact: the
    same float64 additions)."""
    rnd = random.Random(5)
    cap = 50.0
    budget_admin.set_cap(db, "k", cap, {"k"}, None)
    spent = 0.0
    for step in range(60):
        eps = rnd.choice([0.5, 1.25, 3.0, 7.5, cap - spent if spent < cap else 0.5, 100.0])
        eps = max(eps, 1e-9)
        want = ledger.fits(spent, eps, cap)
        try:
            got = charge(db, "k", laplace(eps))
        except budgets.BudgetExhausted as exc:
            assert not want, (step, spent, eps)
            assert exc.extra["remaining"] == ledger.remaining(spent, cap)
            assert exc.headers[budgets.REMAINING_HEADER] == repr(ledger.remaining(spent, cap))
            continue
        assert want, (step, spent, eps)
        spent += eps
        assert got.spent == spent and got.remaining == ledger.remaining(spent, cap)
    assert spent == pytest.approx(cap) or spent <= cap


def test_a_cap_of_zero_refuses_everything_and_no_epsilon_needs_no_cap(db):
    th = ledger.cost("texthide", {})
    assert charge(db, "free", th).cap is None  # counted without a cap
    assert budget_admin.get_budget(db, "free", set(), None)["families"]["texthide"]["sends"] == 1
    budget_admin.set_cap(db, "free", 1e9, set(), None)
    with pytest.raises(budgets.BudgetExhausted, match="no cap admits"):
        charge(db, "free", th)
    budget_admin.set_cap(db, "zero", 0.0, {"zero"}, None)
    for c in (laplace(1e-12), laplace(5.0), th):
        with pytest.raises(budgets.BudgetExhausted):
            charge(db, "zero", c)
    view = budget_admin.get_budget(db, "zero", set(), None)
    assert (view["spent"], view["sends"], view["remaining"]) == (0.0, 0, 0.0)


def test_racing_charges_never_pass_the_cap(db):
    """Eight charges of 1.5 released at once against a cap of 5.0 (each its own
    transaction, connection and thread): exactly three get through."""
    budget_admin.set_cap(db, "race", 5.0, {"race"}, None)
    out = race([lambda: charge(db, "race", laplace(1.5)) for _ in range(8)])
    ok = [o for o in out if isinstance(o, budgets.Charged)]
    assert len(ok) == 3, out
    assert all(isinstance(o, budgets.BudgetExhausted) for o in out if o not in ok), out
    assert budget_admin.get_budget(db, "race", set(), None)["spent"] == 4.5


def test_new_keys_get_the_default_cap_and_a_device_spends_under_its_key(db):
    """The key's ledger counts every device; a device's own ledger has its own cap (the
    default device cap, never above the key's; set by the admin), and a charge must fit
    both."""
    got = charge(db, "new", laplace(1.0), default=10.0)
    assert (got.spent, got.cap, got.remaining) == (1.0, 10.0, 9.0)
    assert got.headers() == {budgets.REMAINING_HEADER: "9.0"}
    dev = charge(db, "new", laplace(2.0), device="phone-1", default=99.0)
    assert (dev.spent, dev.cap, dev.device_spent, dev.device_cap) == (3.0, 10.0, 2.0, None)
    assert dev.remaining == 7.0
    with db.begin(write=True) as conn:  # a new device gets the default device cap (<= key's)
        d2 = budgets.charge(conn, budgets.Charge("new", "phone-2", laplace(1.0), None, 50.0))
    assert (d2.spent, d2.device_spent, d2.device_cap, d2.remaining) == (4.0, 1.0, 10.0, 6.0)
    view = budget_admin.set_device_cap(db, "new", "phone-1", 2.5, set(), None)
    assert [d["cap"] for d in view["devices"]] == [2.5, 10.0]
    with pytest.raises(InvalidRequest, match="never above its key"):
        budget_admin.set_device_cap(db, "new", "phone-1", 11.0, set(), None)
    with pytest.raises(budgets.BudgetExhausted, match="device phone-1 of key new") as exc:
        charge(db, "new", laplace(1.0), device="phone-1")  # fits the key, not the device
    assert exc.value.extra["remaining"] == 0.5
    view = budget_admin.set_cap(db, "new", 3.0, set(), None)  # device caps come down with it
    assert view["cap"] == 3.0 and [d["cap"] for d in view["devices"]] == [2.5, 3.0]
    assert view["spent"] == 4.0 and view["total"] == {"spent": 4.0, "sends": 3}
    assert [d["remaining"] for d in view["devices"]] == [0.0, 0.0]
    with pytest.raises(budgets.BudgetExhausted, match="key new"):
        charge(db, "new", laplace(0.5), device="phone-3")  # a new device id adds nothing
    view = budget_admin.reset(db, "new", set(), None)
    assert view["total"] == {"spent": 0.0, "sends": 0} and view["cap"] == 3.0
    assert [d["device_id"] for d in view["devices"]] == ["phone-1", "phone-2"]
    with pytest.raises(NotFound):
        budget_admin.get_budget(db, "never-seen", {"other"}, None)
    assert budget_admin.get_budget(db, "configured", {"configured"}, 7.0)["cap"] == 7.0
    assert [v["key_id"] for v in budget_admin.list_budgets(db, {"configured"}, None)] == [
        "configured", "new"]
    with pytest.raises(ValueError):
        budget_admin.set_cap(db, "new", float("nan"), set(), None)
    for bad in ("", "a b", "x" * 65, "é"):
        with pytest.raises(InvalidRequest):
            budgets.check_device_id(bad)


def test_racing_devices_of_one_key_never_pass_its_cap(db):
    """Twelve charges of 1.5 from twelve new device ids at once against the key's cap of
    5.0: exactly three get through, on the key's ledger and in all."""
    budget_admin.set_cap(db, "rot", 5.0, {"rot"}, None)
    out = race([lambda i=i: charge(db, "rot", laplace(1.5), device=f"d{i}")
                for i in range(12)])
    ok = [o for o in out if isinstance(o, budgets.Charged)]
    assert len(ok) == 3, out
    view = budget_admin.get_budget(db, "rot", set(), None)
    assert view["spent"] == 4.5 and sum(d["spent"] for d in view["devices"]) == 4.5


def test_a_refund_takes_the_charge_back_with_an_audit_row(db):
    from cloud_api.store.tables import budget_refunds

    budget_admin.set_cap(db, "ref", 5.0, {"ref"}, None)
    ch = budgets.Charge("ref", "dev", laplace(2.0))
    with db.begin(write=True) as conn:
        budgets.charge(conn, ch)
    with db.begin(write=True) as conn:
        budgets.refund(conn, ch, "client-gone")
    view = budget_admin.get_budget(db, "ref", set(), None)
    assert (view["spent"], view["sends"], view["devices"][0]["spent"]) == (0.0, 0, 0.0)
    with db.begin() as conn:
        rows = conn.execute(select(budget_refunds)).all()
    assert [(r.key_id, r.device_id, r.epsilon, r.reason) for r in rows] == [
        ("ref", "dev", 2.0, "client-gone")]


def _records_setup(db, task, tiny_bundle, n=6):
    limits = Limits.for_bundle(tiny_bundle, labels=task.labels)
    payloads = privatize(tiny_bundle, DChiText(tiny_bundle, ETA), n)
    recs = store.validate_records(task, raw_records(payloads), limits)
    d = bundle_diameter(tiny_bundle)
    cost = ledger.total(ledger.payload_cost(r.payload, d, mechanism=task.mechanism,
                                            params=task.params) for r in recs)
    return recs, cost


def _stored(db) -> int:
    with db.begin() as conn:
        return conn.execute(select(func.count()).select_from(records_table)).scalar_one()


def test_records_over_the_cap_store_nothing(db, task, tiny_bundle):
    recs, cost = _records_setup(db, task, tiny_bundle)
    budget_admin.set_cap(db, "app", cost.epsilon * 1.5, {"app"}, None)
    ch = budgets.Charge("app", "", cost)
    first = store.add_records(db, task, recs, "app", "r-1", "d" * 64, charge=ch)
    assert first.charged.spent == pytest.approx(cost.epsilon, rel=1e-12)
    with pytest.raises(budgets.BudgetExhausted):
        store.add_records(db, task, recs, "app", "r-2", "e" * 64, charge=ch)
    assert _stored(db) == len(recs)  # the refused request stored nothing
    budget_admin.set_cap(db, "app", None, set(), None)  # its idempotency key was not kept either
    again = store.add_records(db, task, recs, "app", "r-2", "e" * 64, charge=ch)
    assert not again.replayed and _stored(db) == 2 * len(recs)


def test_a_replay_is_charged_once(db, task, tiny_bundle):
    recs, cost = _records_setup(db, task, tiny_bundle)
    ch = budgets.Charge("app", "dev", cost)
    got = [store.add_records(db, task, recs, "app", "same", "f" * 64, charge=ch)
           for _ in range(3)]
    assert [g.replayed for g in got] == [False, True, True]
    # racing twins of one new key: one stores and is charged, the others replay
    out = race([lambda: store.add_records(db, task, recs, "app", "twin", "a" * 64, charge=ch)
                for _ in range(4)])
    assert sum(not o.replayed for o in out) == 1, out
    view = budget_admin.get_budget(db, "app", set(), None)
    assert view["devices"][0]["sends"] == 2 * len(recs)
    assert view["devices"][0]["spent"] == pytest.approx(2 * cost.epsilon, rel=1e-12)


def test_racing_records_requests_never_pass_the_cap(db, task, tiny_bundle):
    """Six records requests released at once against a cap that admits two: the charge
    rides in the statement that takes the record ids (PostgreSQL), so exactly two store
    their rows, under the ids they answered, and the ledger holds exactly their cost."""
    recs, cost = _records_setup(db, task, tiny_bundle, n=3)
    budget_admin.set_cap(db, "racer", cost.epsilon * 2.5, {"racer"}, None)
    ch = budgets.Charge("racer", "", cost)
    out = race([lambda: store.add_records(db, task, recs, "racer", charge=ch)
                for _ in range(6)])
    ok = [o for o in out if isinstance(o, store.Stored)]
    assert len(ok) == 2, out
    assert all(isinstance(o, budgets.BudgetExhausted) for o in out if o not in ok), out
    assert sorted(o.charged.spent for o in ok) == pytest.approx([cost.epsilon,
                                                                 2 * cost.epsilon])
    with db.begin() as conn:
        stored = sorted(conn.execute(select(records_table.c.id)
                                     .where(records_table.c.key_id == "racer")).scalars())
    assert stored == sorted(i for o in ok for i in o.ids)
    view = budget_admin.get_budget(db, "racer", set(), None)
    assert view["spent"] == pytest.approx(2 * cost.epsilon, rel=1e-12)
    assert view["sends"] == 2 * len(recs)


def test_a_prediction_without_an_answer_is_refunded_once_its_charge_commits(db):
    """The predict path's refund (cloud_api.charging.unanswered) through the real charge
    writer: a client gone, then a cancelled request; each charge is taken back after it
    committed, with its audit row, so a charge that fits only after both refunds goes
    through; a refused charge is the 403 and is not refunded."""
    import asyncio

    from cloud_api.charging import unanswered
    from cloud_api.serving.payload_queue import ClientGone
    from cloud_api.store.charge_writer import ChargeWriter
    from cloud_api.store.tables import budget_refunds

    budget_admin.set_cap(db, "gone", 5.0, {"gone"}, None)
    ch = budgets.Charge("gone", "dev", laplace(2.0))

    async def run():
        writer = ChargeWriter(db)
        try:
            await unanswered(writer, writer.submit(ch), ch, ClientGone("went away"))
            pending = writer.submit(ch)
            await unanswered(writer, pending, ch, asyncio.CancelledError())
            await pending
            with pytest.raises(budgets.BudgetExhausted):
                big = budgets.Charge("gone", "dev", laplace(9.0))
                await unanswered(writer, writer.submit(big), big, ClientGone("went away"))
            return await writer.charge(budgets.Charge("gone", "dev", laplace(5.0)))
        finally:
            writer.close()

    got = asyncio.run(run())
    assert (got.spent, got.device_spent) == (5.0, 5.0)
    with db.begin() as conn:
        reasons = sorted(r.reason for r in conn.execute(select(budget_refunds)))
    assert reasons == ["cancelled", "client-gone"]


def test_refused_charges_of_new_devices_leave_no_row(db):
    """Thirty charges of 1.5 from thirty new device ids against a key's cap of 5.0, through
    three charge writers at once (three server processes: group commits that hold refused
    charges beside committed ones, and that race each other): three get through, and only
    their devices have a row (issue 34: each refusal left a zero row behind)."""
    import asyncio

    from cloud_api.store.charge_writer import ChargeWriter
    from cloud_api.store.tables import budgets as budgets_table

    budget_admin.set_cap(db, "rot2", 5.0, {"rot2"}, None)

    async def run():
        writers = [ChargeWriter(db) for _ in range(3)]
        try:
            return await asyncio.gather(*(
                writers[i % 3].charge(budgets.Charge("rot2", f"d{i}", laplace(1.5)))
                for i in range(30)), return_exceptions=True)
        finally:
            for w in writers:
                w.close()

    out = asyncio.run(run())
    ok = [o for o in out if isinstance(o, budgets.Charged)]
    assert len(ok) == 3 and all(isinstance(o, budgets.BudgetExhausted)
                                for o in out if o not in ok), out
    with db.begin() as conn:
        rows = conn.execute(select(budgets_table.c.device_id, budgets_table.c.sends).where(
            budgets_table.c.key_id == "rot2")).all()
    assert sorted(s for d, s in rows if d) == [1, 1, 1] and len(rows) == 4, rows
