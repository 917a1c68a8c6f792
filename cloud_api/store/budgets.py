"""The server's privacy budget ledgers: one per API key id, and one per ``X-Device-Id`` under
it (docs/ledger.md, "On the server"). What a request costs comes from ``shared.ledger`` (the
caller computes it from its task's or model's mechanism and the payloads received).

    ch = Charge(key_id, device_id, cost, default_cap, default_device_cap)
    with db.begin(write=True) as conn:       # the transaction that stores the records
        charged = charge(conn, ch)           # BudgetExhausted: the transaction rolls back
        ...insert the records...
    charged.remaining                        # X-Privacy-Budget-Remaining

A key's cap is the key's: its own row (``device_id`` '') counts everything the key sent,
with or without a device id, under the key's cap (``PUT /admin/budgets/{key_id}``; new keys
get ``PRIVBERT_DEFAULT_BUDGET``). A request with ``X-Device-Id`` is charged to that row and
to its device's row together; a device row may have a cap of its own
(``PRIVBERT_DEFAULT_DEVICE_BUDGET``, ``PUT /admin/budgets/{key_id}/devices/{device_id}``;
the caps are set in :mod:`cloud_api.store.budget_admin`), never above the key's; NULL: the
key's cap alone bounds it. So new device ids cannot add to what a key may spend.

One statement checks and charges both rows: it updates them only when every one of them
fits (the filter of ``shared.ledger.fits``: ``cap IS NULL OR (cap > 0 AND spent + c <=
cap)``), so both are charged or neither. PostgreSQL: the rows are first locked (``SELECT
... ORDER BY device_id FOR UPDATE`` in a materialized CTE, the key's row first, so two
charges of one key never deadlock), and a locked row is read in its latest committed
version, so the decision is taken on what concurrent charges committed; the locks are held
until the commit. SQLite: ``BEGIN IMMEDIATE`` holds the write lock from the start.
Concurrent requests never pass a cap together; a refused request changes nothing, and the
caller's transaction is rolled back. A refused charge of a key or device seen for the
first time makes no row either (the charge writer commits a group of charges together,
refused ones included): it is judged on the rows as they would be made, before any is,
and the rows made for a charge that a concurrent one then leaves no room for are rolled
back to a savepoint.

A prediction charged but never answered (the client went away, the forward failed) is
refunded (:func:`refund`): the same amounts taken off the same rows, and an audit row in
``budget_refunds``. A refund follows the commit of its charge, so a ledger's spent is never
below the charges of answered requests; a concurrent request meanwhile sees more spent, not
less (up to float rounding, as any sum of the ledger). Erasing records refunds nothing: the
payloads were received.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, and_, insert, select, text
from sqlalchemy.dialects import postgresql, sqlite

from cloud_api.errors import InvalidRequest, ServiceError
from cloud_api.store.tables import budget_refunds, budgets
from shared import ledger
from shared.ledger import Cost

ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
_ID = re.compile(ID_PATTERN)
REMAINING_HEADER = "X-Privacy-Budget-Remaining"


class BudgetExhausted(ServiceError):
    """The request would pass a ledger's cap (its key's or its device's): nothing of it is
    stored (403)."""

    status, kind, title = 403, "budget-exhausted", "Privacy budget exhausted"

    def __init__(self, needed: float | None, spent: float, cap: float, key_id: str,
                 device_id: str, remaining: float | None = None):
        left = ledger.remaining(spent, cap) if remaining is None else remaining
        who = f"device {device_id} of key {key_id}" if device_id else f"key {key_id}"
        need = ("a mechanism without a differential-privacy epsilon, which no cap admits"
                if needed is None else f"worst-case epsilon {needed:.6g}")
        super().__init__(f"this request needs {need}; the ledger of {who} has spent "
                         f"{spent:.6g} of its cap {cap:.6g} (remaining {left:.6g}); nothing "
                         "was stored", headers={REMAINING_HEADER: repr(left)},
                         extra={"remaining": left, "spent": spent, "cap": cap,
                                "needed": needed})


@dataclass(frozen=True)
class Charge:
    """What to charge to which ledgers (the key's, and its device's when ``device_id``);
    ``default_cap`` for a key seen for the first time, ``default_device_cap`` for a new
    device (never above the key's)."""

    key_id: str
    device_id: str
    cost: Cost
    default_cap: float | None = None
    default_device_cap: float | None = None


def least(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


@dataclass(frozen=True)
class Charged:
    """The ledgers after a charge: the key's, and the device's (None without one)."""

    spent: float
    cap: float | None
    cost: Cost  # what was charged
    device_spent: float | None = None
    device_cap: float | None = None

    @property
    def remaining(self) -> float | None:
        """What the caller may still spend: the least of its key's and device's remaining."""
        own = (None if self.device_spent is None
               else ledger.remaining(self.device_spent, self.device_cap))
        return least(ledger.remaining(self.spent, self.cap), own)

    def headers(self) -> dict[str, str]:
        """``X-Privacy-Budget-Remaining`` when a ledger has a cap."""
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
_FITS = "(cap IS NULL OR (cap > 0 AND spent + :eps <= cap))"
_ROWS = "key_id = :k AND device_id IN ('', :d)"
# the charged family's row of each charged ledger, made at its first charge (tables.py)
_FAMILY_ADD = (
    "INSERT INTO budget_families (key_id, device_id, family, epsilon, metric, tokens, sends) "
    "{rows} ON CONFLICT (key_id, device_id, family) DO UPDATE SET "
    "epsilon = budget_families.epsilon + excluded.epsilon, "
    "metric = budget_families.metric + excluded.metric, "
    "tokens = budget_families.tokens + excluded.tokens, "
    "sends = budget_families.sends + excluded.sends")


def _sets(epsilon: bool, sign: str) -> list[str]:
    """``SET`` terms of the ledger rows adding (``sign`` '+') or taking off ('-') a cost of a
    family with (``epsilon``) or without a worst-case ε."""
    out = [f"sends = sends {sign} :sends", "updated_at = :now"]
    if epsilon:
        out.append("spent = spent + :eps" if sign == "+" else  # never below zero (rounding)
                   "spent = CASE WHEN spent > :eps THEN spent - :eps ELSE 0.0 END")
    return out


def _update(epsilon: bool, dialect: str):
    """The check-and-charge statement of a family with or without ε on ``dialect``, with
    bound parameters k (key id), d (device id; '' for none), n (rows: 1 or 2), eps, feps
    (the family row's ε: 0 without one), family, metric, tokens, sends and now: it updates
    the key's and the device's rows only if both exist and every one fits (module
    docstring), and adds the cost to their rows of the family (PostgreSQL: in the same
    statement; SQLite: :data:`_FAMILY_SQLITE` follows it in the transaction, which holds
    the write lock). Built once per kind and dialect."""
    fits = _FITS if epsilon else "cap IS NULL"
    sets = ", ".join(_sets(epsilon, "+"))
    if dialect == "postgresql":
        sql = (f"WITH locked AS MATERIALIZED (SELECT spent, cap FROM budgets WHERE {_ROWS} "
               f"ORDER BY device_id FOR UPDATE), ok AS (SELECT count(*) = :n AND "
               f"coalesce(bool_and({fits}), false) AS fits FROM locked), "
               f"upd AS (UPDATE budgets SET {sets} FROM ok WHERE budgets.key_id = :k AND "
               "budgets.device_id IN ('', :d) AND ok.fits RETURNING budgets.device_id, "
               "budgets.spent, budgets.cap), fam AS ("
               + _FAMILY_ADD.format(rows="SELECT :k, upd.device_id, :family, :feps, :metric, "
                                         ":tokens, :sends FROM upd")
               + ") SELECT device_id, spent, cap FROM upd")
    else:
        sql = (f"UPDATE budgets SET {sets} WHERE {_ROWS} AND (SELECT count(*) = :n AND "
               f"coalesce(min({fits}), 0) FROM budgets WHERE {_ROWS}) "
               "RETURNING device_id, spent, cap")
    return text(sql)


_UPDATES = {(epsilon, dialect): _update(epsilon, dialect) for epsilon in (True, False)
            for dialect in ("postgresql", "sqlite")}
_FAMILY_SQLITE = text(_FAMILY_ADD.format(
    rows="VALUES (:k, :d, :family, :feps, :metric, :tokens, :sends)"))


def row_of(key_id: str, device_id: str):
    return and_(budgets.c.key_id == key_id, budgets.c.device_id == device_id)


def insert_ignoring(conn: Connection, values: dict) -> None:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(dialect.insert(budgets).values(**values).on_conflict_do_nothing(
        index_elements=["key_id", "device_id"]))


def new_row(key_id: str, device_id: str, cap: float | None, now: datetime) -> dict:
    return {"key_id": key_id, "device_id": device_id, "cap": cap, "spent": 0.0, "sends": 0,
            "updated_at": now}


def _ensure(conn: Connection, ch: Charge, now: datetime) -> None:
    """The key's row (the default cap) and the device's (the default device cap, never
    above the key's), where missing."""
    insert_ignoring(conn, new_row(ch.key_id, "", ch.default_cap, now))
    if ch.device_id:
        key_cap = conn.execute(select(budgets.c.cap).where(row_of(ch.key_id, ""))
                               ).scalar_one()
        cap = ch.default_device_cap
        if cap is not None and key_cap is not None:
            cap = min(cap, key_cap)
        insert_ignoring(conn, new_row(ch.key_id, ch.device_id, cap, now))


def _params(ch: Charge, now: datetime) -> dict:
    c = ch.cost
    return {"k": ch.key_id, "d": ch.device_id, "n": 2 if ch.device_id else 1,
            "eps": c.epsilon, "feps": c.epsilon or 0.0, "family": c.family,
            "metric": c.metric, "tokens": c.tokens, "sends": c.sends, "now": now}


def _add_to_families(conn: Connection, rows, params: dict) -> None:
    """SQLite: the charged family's rows of the ledgers the charge updated."""
    if conn.dialect.name != "postgresql":
        conn.execute(_FAMILY_SQLITE, [{**params, "d": r.device_id} for r in rows])


def _charged(rows, cost: Cost) -> Charged:
    key = next(r for r in rows if r.device_id == "")
    dev = next((r for r in rows if r.device_id != ""), None)
    return Charged(float(key.spent), _float(key.cap), cost,
                   None if dev is None else float(dev.spent), None if dev is None else
                   _float(dev.cap))


def _float(x) -> float | None:
    return None if x is None else float(x)


@dataclass(frozen=True)
class _Row:
    spent: float
    cap: float | None


def _refusal(conn: Connection, ch: Charge) -> BudgetExhausted | None:
    """The refusal of ``ch`` on the ledgers as they are, a missing row counted as it would
    be made (nothing spent, its default cap); None: it fits."""
    have = {r.device_id: _Row(r.spent, r.cap) for r in conn.execute(
        select(budgets.c.device_id, budgets.c.spent, budgets.c.cap).where(
            budgets.c.key_id == ch.key_id, budgets.c.device_id.in_(["", ch.device_id])))}
    if "" not in have:
        have[""] = _Row(0.0, ch.default_cap)
    if ch.device_id and ch.device_id not in have:
        cap, key_cap = ch.default_device_cap, have[""].cap
        have[ch.device_id] = _Row(0.0, cap if cap is None or key_cap is None
                                  else min(cap, key_cap))
    eps = ch.cost.epsilon
    key = have[""]
    left = ledger.remaining(key.spent, key.cap)
    if ch.device_id:
        dev = have[ch.device_id]
        left = least(left, ledger.remaining(dev.spent, dev.cap))
        if dev.cap is not None and not ledger.fits(dev.spent, eps, dev.cap):
            return BudgetExhausted(eps, dev.spent, dev.cap, ch.key_id, ch.device_id, left)
    if key.cap is not None and not ledger.fits(key.spent, eps, key.cap):
        return BudgetExhausted(eps, key.spent, key.cap, ch.key_id, "", left)
    return None


def charge(conn: Connection, ch: Charge) -> Charged:
    """Check and charge ``ch`` in the caller's write transaction, to the key's ledger and to
    its device's: :class:`BudgetExhausted` (nothing changed) unless both fit."""
    now = datetime.now(UTC)
    stmt = _UPDATES[ledger.has_epsilon(ch.cost.family), conn.dialect.name]
    params = _params(ch, now)
    rows = conn.execute(stmt, params).all()
    if not rows:
        refused = _refusal(conn, ch)  # a new key's or device's rows as they would be made
        if refused is not None:
            raise refused  # before any row is made: a refusal leaves no row behind
        with conn.begin_nested():  # a concurrent charge took the rest meanwhile: the rows
            _ensure(conn, ch, now)  # made here go with the refusal (a savepoint)
            rows = conn.execute(stmt, params).all()
            if not rows:
                raise _refusal(conn, ch) or BudgetExhausted(ch.cost.epsilon, 0.0, 0.0,
                                                            ch.key_id, ch.device_id)
            _add_to_families(conn, rows, params)
        return _charged(rows, ch.cost)
    _add_to_families(conn, rows, params)
    return _charged(rows, ch.cost)


REFUND_REASONS = ("client-gone", "forward-failed", "overloaded", "unavailable", "cancelled",
                  "non-finite")


def refund(conn: Connection, ch: Charge, reason: str) -> None:
    """Take a committed charge ``ch`` back off its ledgers (a prediction that got no answer),
    with its audit row in ``budget_refunds``, in the caller's write transaction."""
    if reason not in REFUND_REASONS:
        raise ValueError(f"refund reason must be one of {REFUND_REASONS}, got {reason!r}")
    now = datetime.now(UTC)
    p = _params(ch, now)
    conn.execute(_REFUNDS[ledger.has_epsilon(ch.cost.family)], p)
    conn.execute(_FAMILY_REFUND, p)
    c = ch.cost
    conn.execute(insert(budget_refunds).values(
        key_id=ch.key_id, device_id=ch.device_id, family=c.family, epsilon=c.epsilon,
        metric=c.metric, tokens=c.tokens, sends=c.sends, reason=reason, created_at=now))


_REFUNDS = {epsilon: text(f"UPDATE budgets SET {', '.join(_sets(epsilon, '-'))} "
                          f"WHERE {_ROWS}") for epsilon in (True, False)}
_FAMILY_REFUND = text(  # ε and the metric never below zero (float rounding)
    "UPDATE budget_families SET epsilon = CASE WHEN epsilon > :feps THEN epsilon - :feps "
    "ELSE 0.0 END, metric = CASE WHEN metric > :metric THEN metric - :metric ELSE 0.0 END, "
    f"tokens = tokens - :tokens, sends = sends - :sends WHERE {_ROWS} AND family = :family")
