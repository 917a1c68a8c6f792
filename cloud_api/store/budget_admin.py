"""The administration of the privacy budget ledgers (``/admin/budgets``): each key's ledger
and its devices' as JSON views, the caps of a key and of a device, and a reset. How a
request is checked and charged, and what the caps mean, is :mod:`cloud_api.store.budgets`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, delete, select, update

from cloud_api.errors import InvalidRequest, NotFound
from cloud_api.store.budgets import (
    check_device_id,
    insert_ignoring,
    least,
    new_row,
    row_of,
)
from cloud_api.store.db import Database
from cloud_api.store.tables import budget_families, budgets
from shared import ledger


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.6g}"


def _families(r) -> dict:
    """Each registered family's figures on ledger row ``r`` (its ``families``: the family
    rows by name; a family without a row has spent nothing: 0.0, or 0 on a ledger not made
    yet, as its columns used to read)."""
    zero = 0.0 if "id" in r else 0
    out = {}
    for fam in ledger.families():
        f = r["families"].get(fam.name)
        out[fam.name] = {"epsilon": (f.epsilon if f else zero) if fam.epsilon else None,
                         "sends": f.sends if f else 0}
        if fam.metric:
            out[fam.name].update(metric=f.metric if f else zero, tokens=f.tokens if f else 0)
    return out


def _ledger(r) -> dict:
    return {"spent": r["spent"], "cap": r["cap"],
            "remaining": ledger.remaining(r["spent"], r["cap"]), "sends": r["sends"],
            "families": _families(r)}


def _key_view(key_id: str, rows: list, default_cap: float | None) -> dict:
    """The key's ledger (everything the key sent, under the key's cap) and each device's
    (its own spend; ``cap``: its own cap, null when only the key's bounds it;
    ``remaining``: what the device may still spend, the least of both)."""
    own = next((r for r in rows if r["device_id"] == ""), None)
    view: dict[str, Any] = {"key_id": key_id, "units": "worst-case epsilon"}
    view.update(_ledger(own) if own is not None else _ledger(
        {**new_row(key_id, "", default_cap, datetime.now(UTC)), "families": {}}))
    key_left = view["remaining"]
    view["devices"] = []
    for r in rows:
        if r["device_id"] != "":
            d = {"device_id": r["device_id"], **_ledger(r)}
            d["remaining"] = least(d["remaining"], key_left)
            view["devices"].append(d)
    view["total"] = {"spent": view["spent"], "sends": view["sends"]}
    return view


def _rows(conn: Connection, key_id: str | None = None) -> list:
    """The ledger rows (of ``key_id``, else all), each with its ``families`` rows by name."""
    q = select(budgets).order_by(budgets.c.key_id, budgets.c.device_id)
    f = select(budget_families)
    if key_id is not None:
        q = q.where(budgets.c.key_id == key_id)
        f = f.where(budget_families.c.key_id == key_id)
    fams: dict[tuple[str, str], dict] = {}
    for r in conn.execute(f):
        fams.setdefault((r.key_id, r.device_id), {})[r.family] = r
    return [{**r._mapping, "families": fams.get((r.key_id, r.device_id), {})}
            for r in conn.execute(q)]


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


def _known_key(conn: Connection, key_id: str, known: set[str]) -> None:
    if not conn.execute(select(budgets.c.id).where(budgets.c.key_id == key_id)).first() \
            and key_id not in known:
        raise NotFound(f"no key {key_id!r}: not configured here and never charged")


def set_cap(db: Database, key_id: str, cap: float | None, known: set[str],
            default_cap: float | None) -> dict:
    """Set (None: remove) the cap of ``key_id``'s own ledger; a device cap above the new cap
    comes down to it (a device's cap is never above its key's)."""
    cap = ledger.check_cap(cap)
    now = datetime.now(UTC)
    with db.begin(write=True) as conn:
        _known_key(conn, key_id, known)
        insert_ignoring(conn, new_row(key_id, "", cap, now))
        conn.execute(update(budgets).where(row_of(key_id, "")).values(cap=cap, updated_at=now))
        if cap is not None:
            conn.execute(update(budgets).where(
                budgets.c.key_id == key_id, budgets.c.device_id != "", budgets.c.cap > cap,
            ).values(cap=cap, updated_at=now))
        rows = _rows(conn, key_id)
    return _key_view(key_id, rows, default_cap)


def set_device_cap(db: Database, key_id: str, device_id: str, cap: float | None,
                   known: set[str], default_cap: float | None) -> dict:
    """Set (None: remove) the cap of one device's ledger of ``key_id``; InvalidRequest (422)
    above the key's cap."""
    cap = ledger.check_cap(cap)
    device_id = check_device_id(device_id)
    if not device_id:
        raise InvalidRequest("a device id is needed")
    now = datetime.now(UTC)
    with db.begin(write=True) as conn:
        _known_key(conn, key_id, known)
        insert_ignoring(conn, new_row(key_id, "", default_cap, now))
        key_cap = conn.execute(select(budgets.c.cap).where(row_of(key_id, ""))).scalar_one()
        if key_cap is not None and cap is not None and cap > key_cap:
            raise InvalidRequest(f"a device's cap is never above its key's: key {key_id} has "
                                 f"cap {_fmt(key_cap)}, {_fmt(cap)} asked")
        insert_ignoring(conn, new_row(key_id, device_id, cap, now))
        conn.execute(update(budgets).where(row_of(key_id, device_id))
                     .values(cap=cap, updated_at=now))
        rows = _rows(conn, key_id)
    return _key_view(key_id, rows, default_cap)


def reset(db: Database, key_id: str, known: set[str], default_cap: float | None) -> dict:
    """Spent and counts back to zero on every ledger of ``key_id`` (the caps stay)."""
    now = datetime.now(UTC)
    with db.begin(write=True) as conn:
        got = conn.execute(update(budgets).where(budgets.c.key_id == key_id).values(
            spent=0.0, sends=0, updated_at=now))
        conn.execute(delete(budget_families).where(budget_families.c.key_id == key_id))
        if got.rowcount == 0 and key_id not in known:
            raise NotFound(f"no key {key_id!r}: not configured here and never charged")
        rows = _rows(conn, key_id)
    return _key_view(key_id, rows, default_cap)
