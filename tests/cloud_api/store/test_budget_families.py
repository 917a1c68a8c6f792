"""Budget families as rows (migration ``0006_budget_families``), on SQLite and a real
PostgreSQL: a database of migration 0005 with data in every family column keeps every
figure after the upgrade (the admin views read what the columns held), charges and refunds
after it land on the family's row, a family the registry adds later needs no migration, and
the downgrade puts the columns back with the figures of the rows."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import inspect, select, text

from cloud_api.store import budget_admin, budgets
from cloud_api.store.db import Database
from cloud_api.store.tables import budget_families
from shared import ledger

COLUMNS = ("dchi_epsilon", "dchi_metric", "dchi_tokens", "dchi_sends", "laplace_epsilon",
           "laplace_sends", "rr_epsilon", "rr_sends", "texthide_sends", "none_sends")
# (key, device, cap, spent, sends, figures of the ten columns of 0005)
ROWS = [
    ("k1", "", 100.0, 21.5, 9, (12.0, 0.3, 30, 3, 7.5, 2, 2.0, 1, 2, 1)),
    ("k1", "d1", None, 12.0, 3, (12.0, 0.3, 30, 3, 0.0, 0, 0.0, 0, 0, 0)),
    ("k2", "", None, 0.0, 4, (0.0, 0.0, 0, 0, 0.0, 0, 0.0, 0, 4, 0)),
    ("k3", "", 5.0, 0.0, 0, (0.0,) * 2 + (0,) * 2 + (0.0, 0, 0.0, 0, 0, 0)),
]


def _at_0005(db_url: str) -> Database:
    db = Database(db_url)
    db.upgrade("0005_key_caps")
    now = datetime.now(UTC)
    with db.begin(write=True) as conn:  # the table of 0005 (its columns, not today's)
        for key, dev, cap, spent, sends, figures in ROWS:
            values = {"key_id": key, "device_id": dev, "cap": cap, "spent": spent,
                      "sends": sends, "updated_at": now, **dict(zip(COLUMNS, figures,
                                                                   strict=True))}
            conn.execute(text(f"INSERT INTO budgets ({', '.join(values)}) VALUES "
                              f"({', '.join(':' + c for c in values)})"), values)
    return db


def _families(view: dict) -> tuple:
    f = view["families"]
    return (f["dchi"], f["laplace"], f["randomized-response"], f["texthide"], f["none"])


def test_upgrade_carries_every_figure_over_and_the_views_read_them(db_url):
    db = _at_0005(db_url)
    try:
        assert db.upgrade() == db.head()
        cols = {c["name"] for c in inspect(db.engine).get_columns("budgets")}
        assert cols == {"id", "key_id", "device_id", "cap", "spent", "sends", "updated_at"}
        k1 = budget_admin.get_budget(db, "k1", set(), None)
        assert (k1["spent"], k1["cap"], k1["sends"]) == (21.5, 100.0, 9)
        assert _families(k1) == (
            {"epsilon": 12.0, "sends": 3, "metric": 0.3, "tokens": 30},
            {"epsilon": 7.5, "sends": 2}, {"epsilon": 2.0, "sends": 1},
            {"epsilon": None, "sends": 2}, {"epsilon": None, "sends": 1})
        dev = k1["devices"][0]
        assert (dev["device_id"], dev["spent"]) == ("d1", 12.0)
        assert _families(dev)[:2] == ({"epsilon": 12.0, "sends": 3, "metric": 0.3,
                                       "tokens": 30}, {"epsilon": 0.0, "sends": 0})
        assert _families(budget_admin.get_budget(db, "k2", set(), None))[3] == \
            {"epsilon": None, "sends": 4}
        k3 = budget_admin.get_budget(db, "k3", set(), None)  # all zero: no family rows
        assert _families(k3)[0] == {"epsilon": 0.0, "sends": 0, "metric": 0.0, "tokens": 0}
        never = budget_admin.get_budget(db, "k9", {"k9"}, None)  # no ledger at all
        assert _families(never)[0] == {"epsilon": 0, "sends": 0, "metric": 0, "tokens": 0}
        with db.begin() as conn:
            n = conn.execute(select(budget_families.c.family)).all()
        assert len(n) == 5 + 1 + 1  # k1: five families, d1: dchi, k2: texthide
    finally:
        db.dispose()


def test_charges_and_refunds_after_it_land_on_the_familys_row(db_url):
    db = _at_0005(db_url)
    try:
        db.upgrade()
        cost = ledger.cost("dchi-text", {"eta": 2.0}, tokens=5, diameter=1.5)  # eps 15
        with db.begin(write=True) as conn:
            got = budgets.charge(conn, budgets.Charge("k1", "d1", cost))
        assert (got.spent, got.device_spent) == (36.5, 27.0)
        view = budget_admin.get_budget(db, "k1", set(), None)
        assert view["families"]["dchi"] == {"epsilon": 27.0, "sends": 4, "metric": 10.3,
                                            "tokens": 35}
        assert view["devices"][0]["families"]["dchi"]["tokens"] == 35
        with db.begin(write=True) as conn:
            budgets.refund(conn, budgets.Charge("k1", "d1", cost), "client-gone")
        view = budget_admin.get_budget(db, "k1", set(), None)
        assert view["families"]["dchi"] == {"epsilon": 12.0, "sends": 3,
                                            "metric": pytest.approx(0.3), "tokens": 30}
        assert (view["spent"], view["sends"]) == (21.5, 9)
        with db.begin(write=True) as conn:  # a new key: its first charge makes its rows
            budgets.charge(conn, budgets.Charge("new", "", ledger.cost(
                "laplace", {"epsilon": 1.0}, dim=4)))
        assert budget_admin.get_budget(db, "new", set(), None)["families"]["laplace"] == \
            {"epsilon": 1.0, "sends": 1}
        budget_admin.reset(db, "k1", set(), None)
        assert _families(budget_admin.get_budget(db, "k1", set(), None))[0]["epsilon"] == 0.0
    finally:
        db.dispose()


def test_a_family_registered_later_needs_no_migration(db, monkeypatch):
    fam = ledger.BudgetFamily("toy-family")
    monkeypatch.setitem(ledger._FAMILIES, fam.name, fam)
    with db.begin(write=True) as conn:
        budgets.charge(conn, budgets.Charge("k", "", ledger.Cost(fam.name, 0.5)))
        budgets.charge(conn, budgets.Charge("k", "", ledger.Cost(fam.name, 0.25)))
    view = budget_admin.get_budget(db, "k", set(), None)
    assert view["families"]["toy-family"] == {"epsilon": 0.75, "sends": 2}
    assert view["spent"] == 0.75


def test_downgrade_puts_the_columns_back(db_url):
    db = _at_0005(db_url)
    try:
        db.upgrade()
        with db.begin(write=True) as conn:
            budgets.charge(conn, budgets.Charge("k2", "", ledger.cost("texthide", {})))
        db.downgrade("0005_key_caps")
        with db.begin() as conn:
            rows = conn.execute(text(f"SELECT key_id, device_id, {', '.join(COLUMNS)} FROM "
                                     "budgets ORDER BY key_id, device_id")).all()
        want = [(k, d, *f) for k, d, _, _, _, f in ROWS]
        want[2] = want[2][:10] + (5,) + want[2][11:]  # k2's texthide_sends: 4 + 1
        assert [tuple(r) for r in rows] == want
        assert "budget_families" not in inspect(db.engine).get_table_names()
        assert db.upgrade() == db.head()
    finally:
        db.dispose()
