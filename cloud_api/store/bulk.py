"""Bulk insert of record rows: ids chosen first, then one executemany (SQLite) or COPY
(PostgreSQL), inside the caller's write transaction.

Why not ``insert(...).returning(id)`` with many rows: SQLAlchemy renders it as one
INSERT with thousands of placeholders, which psycopg re-parses on every request (too long
for its statement cache; the largest item in a profile of the insert, ``bench/records.py``).
With the ids known before the insert, ``ids[i]`` is row ``i``'s id by construction:

* SQLite: inside ``BEGIN IMMEDIATE`` (the write lock is ours) the next ids follow the
  largest id ever used (``AUTOINCREMENT`` keeps it in ``sqlite_sequence``, so deleted ids
  are never reused); explicit ids move that counter on.
* PostgreSQL: ``nextval`` of the table's sequence, n times in one query; ids are unique
  and never reused; concurrent requests may interleave theirs, and a request may commit
  its lower ids after another committed higher ones. So the table is locked (ROW
  EXCLUSIVE: writers do not wait for each other) before the ids are taken, and a
  snapshot's watermark (``snapshot.current_watermark``: SHARE) waits for every request in flight:
  no id at or below a watermark can appear after it was taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import orjson
from sqlalchemy import Connection, text

from cloud_api.store.tables import records

if TYPE_CHECKING:
    import psycopg

COLUMNS = ("id", "task_id", "label", "soft_label", "mechanism", "params", "bundle_id",
           "dtype", "shape", "segments", "payload", "key_id", "created_at")
_COLS = ", ".join(COLUMNS)
_SQLITE_INSERT = (f"INSERT INTO records ({_COLS}) VALUES "
                  f"({', '.join('?' for _ in COLUMNS)})")
_PG_COPY = f"COPY records ({_COLS}) FROM STDIN"
_SQLITE_NEXT = text("SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = "
                    "'records'), 0), coalesce((SELECT max(id) FROM records), 0))")
_PG_LOCK = text("LOCK TABLE records IN ROW EXCLUSIVE MODE")
_PG_NEXT = text("SELECT nextval(pg_get_serial_sequence('records', 'id')) "
                "FROM generate_series(1, :n)")


def json_text(value) -> str | None:
    """A JSON column's value as stored (None stays NULL)."""
    return None if value is None else orjson.dumps(value).decode()


def allocate_ids(conn: Connection, n: int) -> list[int]:
    """``n`` new record ids, for rows written in this transaction. SQLite: only inside a
    write (IMMEDIATE) transaction."""
    if n == 0:
        return []
    if conn.dialect.name == "sqlite":
        top = int(conn.execute(_SQLITE_NEXT).scalar_one())
        return list(range(top + 1, top + n + 1))
    conn.execute(_PG_LOCK)  # held to the commit: a watermark waits for these ids
    return [int(i) for i in conn.execute(_PG_NEXT, {"n": n}).scalars()]


def created_at_value(conn: Connection, when: datetime):
    """``when`` as the driver takes it for ``records.created_at`` (SQLite: SQLAlchemy's
    text form, so the ORM reads it back as a datetime)."""
    proc = records.c.created_at.type.dialect_impl(conn.dialect).bind_processor(conn.dialect)
    return proc(when) if proc is not None else when


def write_rows(conn: Connection, rows: Sequence[tuple]) -> None:
    """Insert ``rows`` (tuples in :data:`COLUMNS` order, JSON columns as text)."""
    if not rows:
        return
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(_SQLITE_INSERT, list(rows))  # executemany
        return
    # psycopg 3, in this transaction
    dbapi = cast("psycopg.Connection[Any]", conn.connection.dbapi_connection)
    with dbapi.cursor() as cur, cur.copy(_PG_COPY) as copy:
        for row in rows:
            copy.write_row(row)
