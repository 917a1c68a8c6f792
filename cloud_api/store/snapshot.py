"""Reading a task's stored records back: the watermark (the largest id that no later
commit can go under), the snapshot of the records up to it, rebuilt as
``shared.payload.Record`` for retraining, and the count per class. Writing them is
:mod:`cloud_api.store.records`.

    watermark, rows = snapshot(db, "sst2")   # rows: (id, shared.payload.Record), in id order
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from sqlalchemy import func, select, text

from cloud_api.store.db import Database
from cloud_api.store.tables import SOFT_LABEL_DTYPE, records
from cloud_api.store.tasks import PAYLOAD_CLASSES, Task, get_task
from shared.arrays import Limits
from shared.payload import PAYLOAD_ADAPTER, Record

try:  # SIMD base64 where installed (a cloud dependency); the standard library otherwise
    from pybase64 import b64encode
except ImportError:  # pragma: no cover
    from base64 import b64encode  # type: ignore[assignment]

# re-reading stored rows: they were checked against their task when they came in
_STORED_LIMITS = Limits(max_tokens=1 << 20, max_dim=1 << 20, max_array_bytes=1 << 31,
                        max_bits=1 << 31, max_json_bytes=1 << 40)


def label_counts(db: Database, task: str | Task) -> dict[str, int]:
    """Records of ``task`` per class name (soft labels are not counted)."""
    t = task if isinstance(task, Task) else get_task(db, task)
    with db.begin() as conn:
        got: dict[str, int] = dict(conn.execute(select(records.c.label, func.count())
                                .where(records.c.task_id == t.id, records.c.label.is_not(None))
                                .group_by(records.c.label)).all())
    return {name: int(got.get(name, 0)) for name in t.labels}


def _record(row) -> Record:
    field = PAYLOAD_CLASSES[row.mechanism].array_field
    obj: dict[str, Any] = {"version": 1, "mechanism": row.mechanism, "params": row.params,
                           "bundle_id": row.bundle_id,
                           field: {"dtype": row.dtype, "shape": row.shape,
                                   "data": b64encode(row.payload).decode("ascii")}}
    if row.segments:
        obj["segments"] = row.segments
    payload = PAYLOAD_ADAPTER.validate_python(obj, context={"limits": _STORED_LIMITS})
    label: Any = (row.label if row.soft_label is None
                  else np.frombuffer(row.soft_label, dtype=SOFT_LABEL_DTYPE).tolist())
    return Record(payload=payload, label=label)


def current_watermark(db: Database, task: str | Task) -> int:
    """The largest record id of ``task`` now (0: none), such that no record at or below it
    can appear later: ids are never reused, and on PostgreSQL, where a request may commit
    lower ids after another committed higher ones, this waits for the requests in flight
    (SHARE lock against their ROW EXCLUSIVE, ``bulk.allocate_ids``). SQLite's writers
    are serialized, so its ids commit in order."""
    t = task if isinstance(task, Task) else get_task(db, task)
    with db.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("LOCK TABLE records IN SHARE MODE"))
        return int(conn.execute(select(func.coalesce(func.max(records.c.id), 0))
                                .where(records.c.task_id == t.id)).scalar_one())


def snapshot(db: Database, task: str | Task, watermark: int | None = None,
             chunk: int = 1000) -> tuple[int, Iterator[tuple[int, Record]]]:
    """``(watermark, rows)``: the task's records with id <= watermark (default:
    :func:`current_watermark`), in id order, as ``(id, shared.payload.Record)`` rebuilt from
    the stored bytes; read ``chunk`` rows per query, lazily. The same watermark always
    means the same records (less any erased since)."""
    t = task if isinstance(task, Task) else get_task(db, task)
    if watermark is None:
        watermark = current_watermark(db, t)
    return watermark, _iter_rows(db, t, watermark, chunk)


def _iter_rows(db: Database, t: Task, watermark: int, chunk: int
               ) -> Iterator[tuple[int, Record]]:
    cols = [records.c.id, records.c.label, records.c.soft_label, records.c.mechanism,
            records.c.params, records.c.bundle_id, records.c.dtype, records.c.shape,
            records.c.segments, records.c.payload]
    last = 0
    while True:
        with db.begin() as conn:
            rows = conn.execute(select(*cols).where(
                records.c.task_id == t.id, records.c.id > last, records.c.id <= watermark,
            ).order_by(records.c.id).limit(chunk)).all()
        if not rows:
            return
        for r in rows:
            yield int(r.id), _record(r)
        last = int(rows[-1].id)
