"""The server's privacy budget ledgers: one per API key id, and per ``X-Device-Id`` under it
(docs/ledger.md, "On the server"). What a request costs comes from ``shared.ledger`` (the
caller computes it from its task's or model's mechanism and the payloads received).

    ch = Charge(key_id, device_id, cost, default_cap)
    with db.begin(write=True) as conn:       # the transaction that stores the records
        charged = charge(conn, ch)           # BudgetExhausted: the transaction rolls back
        ...insert the records...
    charged.remaining                        # X-Privacy-Budget-Remaining

A key's cap (``PUT /admin/budgets/{key_id}``; new keys get ``PRIVBERT_DEFAULT_BUDGET``)
applies to each of its ledgers: the key's own (requests without a device id, ``device_id``
'') and each device's. It is copied into every row of the key, so that one statement
checks and charges: ``UPDATE budgets SET spent = spent + c ... WHERE key_id = k AND
device_id = d AND (cap IS NULL OR (cap > 0 AND spent + c <= cap))`` (the filter of
``shared.ledger.fits``). A row is locked by that UPDATE until the commit (PostgreSQL), or
the write lock is held from BEGIN IMMEDIATE (SQLite): concurrent requests never pass a cap
together. A refused request changes nothing, and the caller's transaction is rolled back.
Erasing records refunds nothing: the payloads were received.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, and_, bindparam, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite

from cloud_api.errors import InvalidRequest, NotFound, ServiceError
from cloud_api.store.db import Database
from cloud_api.store.tables import BUDGET_FAMILY_COLUMNS, budgets
from shared import ledger
from shared.ledger import NO_EPSILON, Cost

ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
_ID = re.compile(ID_PATTERN)
REMAINING_HEADER = "X-Privacy-Budget-Remaining"
_COUNTERS = [c.name for c in budgets.columns if c.name.endswith(("_epsilon", "_metric",
                                                                  "_tokens", "_sends"))]


class BudgetExhausted(ServiceError):
    """The request would pass its ledger's cap: nothing of it is stored (403)."""

    status, kind, title = 403, "budget-exhausted", "Privacy budget exhausted"

    def __init__(self, needed: float | None, spent: float, cap: float, key_id: str,
                 device_id: str):
        left = ledger.remaining(spent, cap)
        who = f"key {key_id}" + (f", device {device_id}" if device_id else "")
        need = ("a mechanism without a differential-privacy epsilon, which no cap admits"
                if needed is None else f"worst-case epsilon {needed:.6g}")
        super().__init__(f"this request needs {need}; the ledger of {who} has spent "
                         f"{spent:.6g} of its cap {cap:.6g} (remaining {left:.6g}); nothing "
                         "was stored", headers={REMAINING_HEADER: repr(left)},
                         extra={"remaining": left, "spent": spent, "cap": cap,
                                "needed": needed})


@dataclass(frozen=True)
class Charge:
    """What to charge to which ledger; ``default_cap`` for a key seen for the first time."""

    key_id: str
    device_id: str
    cost: Cost
    default_cap: float | None = None


@dataclass(frozen=True)
class Charged:
    """The ledger after a charge."""

    spent: float
    cap: float | None
    cost: Cost | None = None  # what was charged

    @property
    def remaining(self) -> float | None:
        return ledger.remaining(self.spent, self.cap)

    def headers(self) -> dict[str, str]:
        """``X-Privacy-Budget-Remaining`` when the ledger has a cap."""
        r = self.remaining
        return {} if r is None else {REMAINING_HEADER: repr(r)}


def check_device_id(value: str | None) -> str:
    """The ``X-Device-Id`` of a request ('' when absent); 422 unless 1-64 of
    letters, digits, ``_.:-``."""
    if value is None:
        return ""
    if not _ID.match(value):
        raise InvalidRequest("X-Device-Id must be 1-64 letters, digits, '_', '.', ':', '-'")
    return value


# -- the check-and-charge ----------------------------------------------------------------------
def _update(family: str):
    """The check-and-charge statement of ``family`` with bound parameters k (key id), d
    (device id), eps, metric, tokens, sends and now: built once per family and reused, so
    SQLAlchemy compiles it once (building it per request is a visible share of a request's CPU)."""
    col = budgets.c
    slug = BUDGET_FAMILY_COLUMNS[family]
    sends, eps = bindparam("sends"), bindparam("eps")
    values = {col.sends: col.sends + sends, col[f"{slug}_sends"]: col[f"{slug}_sends"] + sends,
              col.updated_at: bindparam("now")}
    if family in NO_EPSILON:  # the filter of shared.ledger.fits: no epsilon fits no cap
        fits = col.cap.is_(None)
    else:
        values[col.spent] = col.spent + eps
        values[col[f"{slug}_epsilon"]] = col[f"{slug}_epsilon"] + eps
        fits = or_(col.cap.is_(None), and_(col.cap > 0, col.spent + eps <= col.cap))
    if family == "dchi":
        values[col.dchi_metric] = col.dchi_metric + bindparam("metric")
        values[col.dchi_tokens] = col.dchi_tokens + bindparam("tokens")
    return (update(budgets)
            .where(col.key_id == bindparam("k"), col.device_id == bindparam("d"), fits)
            .values(values).returning(col.spent, col.cap))


_UPDATES = {family: _update(family) for family in BUDGET_FAMILY_COLUMNS}


def _row_of(key_id: str, device_id: str):
    return and_(budgets.c.key_id == key_id, budgets.c.device_id == device_id)


def _insert_ignoring(conn: Connection, values: dict) -> None:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(dialect.insert(budgets).values(**values).on_conflict_do_nothing(
        index_elements=["key_id", "device_id"]))


def _new_row(key_id: str, device_id: str, cap: float | None, now: datetime) -> dict:
    return {"key_id": key_id, "device_id": device_id, "cap": cap, "spent": 0.0, "sends": 0,
            "updated_at": now, **dict.fromkeys(_COUNTERS, 0)}


def _ensure(conn: Connection, key_id: str, device_id: str, default_cap: float | None,
            now: datetime) -> None:
    """The key's row (the default cap) and the device's (the key's cap), where missing."""
    _insert_ignoring(conn, _new_row(key_id, "", default_cap, now))
    if device_id:
        cap = conn.execute(select(budgets.c.cap).where(_row_of(key_id, ""))).scalar_one()
        _insert_ignoring(conn, _new_row(key_id, device_id, cap, now))


def charge(conn: Connection, ch: Charge) -> Charged:
    """Check and charge ``ch`` in the caller's write transaction; :class:`BudgetExhausted`
    (nothing changed) when it does not fit."""
    c, now = ch.cost, datetime.now(UTC)
    stmt = _UPDATES[c.family]
    params = {"k": ch.key_id, "d": ch.device_id, "eps": c.epsilon, "metric": c.metric,
              "tokens": c.tokens, "sends": c.sends, "now": now}
    row = conn.execute(stmt, params).first()
    if row is None:
        have = conn.execute(select(budgets.c.spent, budgets.c.cap)
                            .where(_row_of(ch.key_id, ch.device_id))).first()
        if have is None:  # the first charge of this key (or device)
            _ensure(conn, ch.key_id, ch.device_id, ch.default_cap, now)
            row = conn.execute(stmt, params).first()
            if row is None:
                have = conn.execute(select(budgets.c.spent, budgets.c.cap)
                                    .where(_row_of(ch.key_id, ch.device_id))).first()
        if row is None:
            raise BudgetExhausted(c.epsilon, have.spent, have.cap, ch.key_id, ch.device_id)
    return Charged(row.spent, row.cap, c)


# -- reading and administration ----------------------------------------------------------------
def _families(r) -> dict:
    out = {}
    for fam, slug in BUDGET_FAMILY_COLUMNS.items():
        out[fam] = {"epsilon": None if fam in NO_EPSILON else r[f"{slug}_epsilon"],
                    "sends": r[f"{slug}_sends"]}
    out["dchi"].update(metric=r["dchi_metric"], tokens=r["dchi_tokens"])
    return out


def _ledger(r) -> dict:
    return {"spent": r["spent"], "cap": r["cap"],
            "remaining": ledger.remaining(r["spent"], r["cap"]), "sends": r["sends"],
            "families": _families(r)}


def _key_view(key_id: str, rows: list, default_cap: float | None) -> dict:
    own = next((r for r in rows if r["device_id"] == ""), None)
    view = {"key_id": key_id, "units": "worst-case epsilon"}
    view.update(_ledger(own) if own is not None else _ledger(
        _new_row(key_id, "", default_cap, datetime.now(UTC))))
    view["devices"] = [{"device_id": r["device_id"], **_ledger(r)} for r in rows
                       if r["device_id"] != ""]
    view["total"] = {"spent": sum(r["spent"] for r in rows),
                     "sends": sum(r["sends"] for r in rows)}
    return view


def _rows(conn: Connection, key_id: str | None = None) -> list:
    q = select(budgets).order_by(budgets.c.key_id, budgets.c.device_id)
    if key_id is not None:
        q = q.where(budgets.c.key_id == key_id)
    return [dict(r._mapping) for r in conn.execute(q)]


def list_budgets(db: Database, known: set[str], default_cap: float | None) -> list[dict]:
    """Every key with a ledger, and every configured key (``known``), sorted by key id."""
    with db.begin() as conn:
        rows = _rows(conn)
    by_key: dict[str, list] = {k: [] for k in known}
    for r in rows:
        by_key.setdefault(r["key_id"], []).append(r)
    return [_key_view(k, by_key[k], default_cap) for k in sorted(by_key)]


def get_budget(db: Database, key_id: str, known: set[str], default_cap: float | None) -> dict:
    """One key's ledgers; NotFound for a key that is neither configured nor ever charged."""
    with db.begin() as conn:
        rows = _rows(conn, key_id)
    if not rows and key_id not in known:
        raise NotFound(f"no key {key_id!r}: not configured here and never charged")
    return _key_view(key_id, rows, default_cap)


def set_cap(db: Database, key_id: str, cap: float | None, known: set[str],
            default_cap: float | None) -> dict:
    """Set (None: remove) the cap of ``key_id`` and of each of its devices."""
    cap = ledger.check_cap(cap)
    now = datetime.now(UTC)
    with db.begin(write=True) as conn:
        if not conn.execute(select(budgets.c.id).where(budgets.c.key_id == key_id)).first() \
                and key_id not in known:
            raise NotFound(f"no key {key_id!r}: not configured here and never charged")
        _insert_ignoring(conn, _new_row(key_id, "", cap, now))
        conn.execute(update(budgets).where(budgets.c.key_id == key_id)
                     .values(cap=cap, updated_at=now))
        rows = _rows(conn, key_id)
    return _key_view(key_id, rows, default_cap)


def reset(db: Database, key_id: str, known: set[str], default_cap: float | None) -> dict:
    """Spent and counts back to zero on every ledger of ``key_id`` (the cap stays)."""
    now = datetime.now(UTC)
    with db.begin(write=True) as conn:
        got = conn.execute(update(budgets).where(budgets.c.key_id == key_id).values(
            spent=0.0, sends=0, updated_at=now, **dict.fromkeys(_COUNTERS, 0)))
        if got.rowcount == 0 and key_id not in known:
            raise NotFound(f"no key {key_id!r}: not configured here and never charged")
        rows = _rows(conn, key_id)
    return _key_view(key_id, rows, default_cap)
