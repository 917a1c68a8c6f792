"""Labelled privatized records: validate against the task, store whole or not at all,
honour idempotency keys, erase (reading them back for retraining:
:mod:`cloud_api.store.snapshot`).

    env = parse_body(body)                                   # the request's JSON
    recs = validate_records(task, env.records, limits)      # nothing written yet
    stored = add_records(db, task, recs, key_id, idempotency_key, body_digest(env),
                         charge=budgets.Charge(key_id, device_id, cost))  # optional
    stored.ids                                              # in request order

A request's records are inserted in one transaction: ids allocated first, then one
executemany (SQLite) or COPY (PostgreSQL), see ``store/bulk.py``. With a ``charge`` the
sender's privacy budget ledger is checked and charged in that same transaction
(``store/budgets.py``): over its cap, nothing is stored; a replay is not charged again. With an
``Idempotency-Key`` the (key id, idempotency key) row, holding the ids, is inserted before
the records in that same transaction under a unique constraint: a retry after the commit
finds it and gets the same ids; a retry racing the first request waits on the constraint
(PostgreSQL: its INSERT blocks until the first commits, then fails with a unique
violation, and the stored answer is read) or on the write lock that BEGIN IMMEDIATE takes
(SQLite: it begins after the first commits and finds the row).

Erasure and idempotency: an idempotency row only replays while every record it names is
still stored. :func:`delete_records` (by task, ids, key id or any combination) deletes,
in its transaction, the idempotency rows of the senders it touched that name a record
no longer there; erasure by key id alone forgets all of that key's rows. And a replay
that finds any of its stored ids gone (rows left by an older version, or a race with an
erasure) forgets that row too. Either way the same key and body afterwards are a new
request: stored afresh with new ids (201 without ``Idempotent-Replayed``), the whole
request again even when only some of its records had been erased, never an answer naming
ids that no longer exist; the same key with another body is then accepted as well.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from sqlalchemy import and_, delete, insert, select
from sqlalchemy.exc import IntegrityError

from cloud_api.errors import Conflict, InvalidRequest, PayloadMismatch
from cloud_api.store import budgets, bulk
from cloud_api.store.db import Database
from cloud_api.store.tables import SOFT_LABEL_DTYPE, idempotency, records
from cloud_api.store.tasks import (
    PAYLOAD_CLASSES,
    Task,
    TaskName,
    compared_params,
    get_task,
    params_difference,
)
from shared.arrays import Limits
from shared.mechanisms import registry
from shared.payload import Record

try:  # SIMD base64 where installed (a cloud dependency); the standard library otherwise
    from pybase64 import b64decode
except ImportError:  # pragma: no cover
    from base64 import b64decode  # type: ignore[assignment]

_RECORDS = TypeAdapter(list[Record])
_HEX64 = re.compile(r"[0-9a-f]{64}")
MISMATCH = "payload_mismatch"
_MAX_ERRORS = 20
IDEMPOTENCY_KEY_MAX = 255
MAX_RECORD_ID = 2**63 - 1  # the database's ids are signed 64-bit
_CHUNK = 1000  # ids per IN (...) list


class RecordsBody(BaseModel):
    """``POST /v1/records``: the envelope; each record is validated against its task."""

    model_config = ConfigDict(extra="forbid")
    task: TaskName
    records: list[dict[str, Any]] = Field(min_length=1, description="shared.payload.Record "
                                          "objects: {\"payload\": {...}, \"label\": ...}")


class DeleteRecords(BaseModel):
    """``DELETE /admin/records``: selectors, combined with AND (at least one)."""

    model_config = ConfigDict(extra="forbid")
    task: TaskName | None = None
    ids: Annotated[list[Annotated[int, Field(ge=1, le=MAX_RECORD_ID)]],
                   Field(min_length=1, max_length=100_000)] | None = None
    key_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")] | None = None


class IdempotencyKeyReused(InvalidRequest):
    """The same Idempotency-Key with another body (422, as the IETF Idempotency-Key draft
    says)."""

    kind, title = "idempotency-key-reused", "Idempotency-Key reused with another body"


@dataclass(frozen=True)
class Stored:
    """The answer to a records request: ids in request order; ``replayed`` when an
    earlier request with the same idempotency key and body had stored them."""

    ids: list[int]
    replayed: bool = False
    charged: budgets.Charged | None = None  # the sender's ledger after this request


# -- validation (before anything is written) -------------------------------------------------
def parse_body(body: bytes | str) -> RecordsBody:
    """The JSON envelope (pydantic ``ValidationError`` when malformed); the records in it
    are still raw dicts for :func:`validate_records`."""
    return RecordsBody.model_validate_json(body)


def body_digest(env: RecordsBody) -> str:
    """SHA-256 of the canonical body (sorted keys, no spaces): what an idempotency key
    is bound to."""
    return hashlib.sha256(orjson.dumps(env.model_dump(), option=orjson.OPT_SORT_KEYS)
                          ).hexdigest()


def _mismatch(task: Task, raw: Any) -> str | None:
    """A difference of mechanism or bundle seen before full validation (whose size checks
    for the task's bundle would otherwise report it less plainly)."""
    p = raw.get("payload") if isinstance(raw, dict) else None
    if not isinstance(p, dict):
        return None
    mech, bid = p.get("mechanism"), p.get("bundle_id")
    if isinstance(mech, str) and mech in PAYLOAD_CLASSES and mech != task.mechanism:
        return f"mechanism {mech} sent, task accepts {task.mechanism}"
    if isinstance(bid, str) and bid != task.bundle_id and _HEX64.fullmatch(bid):
        return (f"bundle {bid[:12]}… sent, task accepts {task.bundle_id[:12]}… "
                "(fetch the task's bundle)")
    return None


def _issue(i: int | str, loc: Sequence, msg: str, kind: str) -> dict:
    return {"loc": ["records", i, *loc], "msg": msg, "type": kind}


SOFT_LABEL_TOLERANCE = 1e-3  # models.training.data refuses a soft label whose sum is further from 1


def _soft_label_problem(task: Task, label: Any) -> str | None:
    """Why a soft label cannot be stored (None: it can, or it is no soft label). A soft
    label is TextHide's mix of k > 1 one-hot labels: only for such a task, and only a mix
    training accepts (finite, in [0, 1], summing to 1); one stored otherwise would fail
    every later retraining of the task."""
    if not isinstance(label, list):
        return None
    if not registry.get(task.mechanism).mixes_inputs(task.params):
        return (f"a soft label is only for TextHide tasks with k > 1; task {task.name!r} "
                "takes a class name or an index")
    if not all(math.isfinite(v) and 0 <= v <= 1 for v in label) \
            or abs(math.fsum(label) - 1.0) > SOFT_LABEL_TOLERANCE:
        return "a soft label must be values in [0, 1] that sum to 1"
    return None


def validate_records(task: Task, raw: Sequence[Any], limits: Limits) -> list[Record]:
    """Every record checked against ``task`` (``limits``: ``Limits.for_bundle(bundle,
    labels=task.labels)``): payload schema and sizes, mechanism, parameters, bundle, and a
    label of the task (a soft label only for TextHide k > 1, and a distribution).
    :class:`InvalidRequest` / :class:`PayloadMismatch` naming the first
    bad record; nothing is returned unless every record is good."""
    issues = [_issue(i, ["payload"], msg, MISMATCH) for i, obj in enumerate(raw)
              if (msg := _mismatch(task, obj)) is not None]
    recs: list[Record] = []
    if not issues:  # one pydantic call for the whole list
        try:
            recs = _RECORDS.validate_python(list(raw), context={"limits": limits})
        except ValidationError as exc:
            issues = [_issue(e["loc"][0], e["loc"][1:], e["msg"], e["type"]) for e in
                      exc.errors(include_input=False, include_url=False,
                                 include_context=False)]
    if not issues:
        want = compared_params(task.mechanism, task.params)
        for i, rec in enumerate(recs):
            p = rec.payload
            diff = params_difference(compared_params(p.mechanism, p.params.model_dump()), want)
            if diff:
                issues.append(_issue(i, ["payload", "params"], diff, MISMATCH))
            elif rec.label is None:
                issues.append(_issue(i, ["label"], "a label is required", "missing"))
            elif (why := _soft_label_problem(task, rec.label)) is not None:
                issues.append(_issue(i, ["label"], why, "value_error"))
    if issues:
        first = issues[0]
        at = ".".join(str(x) for x in first["loc"][2:])
        where = "" if first["type"] == MISMATCH or not at else f"{at}: "
        more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
        cls = PayloadMismatch if first["type"] == MISMATCH else InvalidRequest
        raise cls(f"record {first['loc'][1]}: {where}{first['msg']}{more}; nothing was "
                  "stored", errors=issues[:_MAX_ERRORS])
    return recs


# -- writing ---------------------------------------------------------------------------------
def _row(task: Task, rec: Record, key_id: str, created_at) -> tuple:
    """A row for :func:`bulk.write_rows` without its id (``bulk.COLUMNS[1:]``)."""
    p = rec.payload
    arr = getattr(p, p.array_field)
    lab = rec.label
    if isinstance(lab, list):
        label, soft = None, np.asarray(lab, dtype=SOFT_LABEL_DTYPE).tobytes()
    else:
        label, soft = (task.labels[lab] if isinstance(lab, int) else lab), None
    seg = getattr(p, "segments", None)
    return (task.id, label, soft, p.mechanism, p.params.model_dump_json(), p.bundle_id,
            arr.dtype, bulk.json_text(list(arr.shape)), bulk.json_text(seg),
            b64decode(arr.data), key_id, created_at)


def _prior(conn, key_id: str, key: str):
    return conn.execute(select(idempotency.c.id, idempotency.c.body_sha256,
                               idempotency.c.record_ids).where(
        idempotency.c.key_id == key_id, idempotency.c.idempotency_key == key)).first()


def _missing(conn, ids) -> set[int]:
    """Those of ``ids`` that are not (any more) in the records table."""
    want = sorted({int(i) for i in ids})
    have: set[int] = set()
    for s in range(0, len(want), _CHUNK):
        have.update(int(i) for i in conn.execute(select(records.c.id).where(
            records.c.id.in_(want[s:s + _CHUNK]))).scalars())
    return set(want) - have


def _forget_erased(conn, key_ids) -> int:
    """Delete the idempotency rows of ``key_ids`` that name a record no longer stored;
    how many."""
    stale: list[int] = []
    for kid in sorted(key_ids):
        rows = conn.execute(select(idempotency.c.id, idempotency.c.record_ids)
                            .where(idempotency.c.key_id == kid)).all()
        gone = _missing(conn, [i for r in rows for i in r.record_ids])
        stale += [r.id for r in rows if gone.intersection(int(i) for i in r.record_ids)]
    for s in range(0, len(stale), _CHUNK):
        conn.execute(delete(idempotency).where(idempotency.c.id.in_(stale[s:s + _CHUNK])))
    return len(stale)


def _replay(prior, digest: str | None) -> Stored:
    if prior.body_sha256 != digest:
        raise IdempotencyKeyReused("this Idempotency-Key was already used with a different "
                                   "body; use a new key for a new request")
    return Stored([int(i) for i in prior.record_ids], replayed=True)


def check_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not 1 <= len(key) <= IDEMPOTENCY_KEY_MAX or not key.isascii() or not key.isprintable():
        raise InvalidRequest(f"Idempotency-Key must be 1-{IDEMPOTENCY_KEY_MAX} printable "
                             "ASCII characters")
    return key


def add_records(db: Database, task: Task, recs: Sequence[Record], key_id: str,
                idempotency_key: str | None = None, digest: str | None = None, *,
                charge: budgets.Charge | None = None) -> Stored:
    """Store validated records of ``task`` in one transaction; with an idempotency key
    (and the body's :func:`body_digest`) a repeat gets the first answer, uncharged. With
    ``charge`` the sender's ledger is charged in the same transaction (BudgetExhausted:
    nothing stored)."""
    check_idempotency_key(idempotency_key)
    if idempotency_key is not None and digest is None:
        raise ValueError("an idempotency key needs the body digest")
    now = datetime.now(UTC)
    try:
        with db.begin(write=True) as conn:
            if idempotency_key is not None:
                prior = _prior(conn, key_id, idempotency_key)
                if prior is not None and _missing(conn, prior.record_ids):
                    # its records were erased: forget that answer, this is a new request
                    conn.execute(delete(idempotency).where(idempotency.c.id == prior.id))
                elif prior is not None:
                    return _replay(prior, digest)
            ids = bulk.allocate_ids(conn, len(recs))
            if idempotency_key is not None:  # a racing twin waits here (PostgreSQL)
                conn.execute(insert(idempotency).values(
                    key_id=key_id, idempotency_key=idempotency_key, body_sha256=digest,
                    record_ids=ids, created_at=now))
            charged = budgets.charge(conn, charge) if charge is not None else None
            when = bulk.created_at_value(conn, now)
            bulk.write_rows(conn, [(i, *_row(task, r, key_id, when))
                                   for i, r in zip(ids, recs, strict=True)])
            return Stored(ids, charged=charged)
    except IntegrityError:
        if idempotency_key is None:
            raise
    # PostgreSQL: a request with the same key committed while we waited on its row
    with db.begin() as conn:
        prior = _prior(conn, key_id, idempotency_key)
        erased = prior is not None and bool(_missing(conn, prior.record_ids))
    if prior is None or erased:
        raise Conflict("a concurrent request with this Idempotency-Key failed or was "
                       "erased; send it again")
    return _replay(prior, digest)


def delete_records(db: Database, *, task: str | None = None, ids: Sequence[int] | None = None,
                   key_id: str | None = None) -> int:
    """Delete the records matching every given selector; the count deleted. The
    idempotency entries that named a deleted record go too (erasure by ``key_id`` alone:
    all of that key's entries), so a replay of such a request is stored afresh."""
    if task is None and not ids and key_id is None:
        raise InvalidRequest("give at least one of task, ids, key_id")
    conds = []
    if task is not None:
        conds.append(records.c.task_id == get_task(db, task).id)
    if key_id is not None:
        conds.append(records.c.key_id == key_id)
    deleted = 0
    senders: set[str] = set()  # key ids whose records went: their idempotency rows to check

    def erase(conn, *where) -> int:
        got = conn.execute(delete(records).where(and_(*where)).returning(records.c.key_id))
        n = 0
        for kid in got.scalars():
            senders.add(kid)
            n += 1
        return n

    with db.begin(write=True) as conn:
        if ids:
            uniq = sorted(set(int(i) for i in ids))
            for s in range(0, len(uniq), _CHUNK):
                deleted += erase(conn, records.c.id.in_(uniq[s:s + _CHUNK]), *conds)
        else:
            deleted = erase(conn, *conds)
        if key_id is not None and task is None and not ids:
            conn.execute(delete(idempotency).where(idempotency.c.key_id == key_id))
        elif senders:
            _forget_erased(conn, senders)
    return int(deleted)
