"""The job queue: retraining and pretraining jobs in one table, shared by every worker.

    job_id = enqueue(db, "retrain", {"task": "sst2", ...}, max_attempts=2)
    job = claim(db, "host:pid:thread")          # atomically queued -> running, or None
    beat = heartbeat(db, job.id, job.worker_id, progress={"step": 10, "total": 90})
    if beat.cancel_requested: ...               # stop the child, then
    finish(db, job.id, job.worker_id, "cancelled")
    reap(db, timeout_s=30)                      # stale running jobs: queued again or failed

States: ``queued -> running -> succeeded | failed | cancelled``; a running job whose
worker stopped heartbeating goes back to ``queued`` while ``attempts < max_attempts``,
else to ``failed`` with the reason. Every change of a running job is conditional on the
worker that owns it (``worker_id``) and on its state, so a worker that lost its job (the
reaper gave it to another) can neither heartbeat nor finish it.

Claiming is atomic on both databases: PostgreSQL ``SELECT ... FOR UPDATE SKIP LOCKED
LIMIT 1`` then the update, in one transaction (concurrent claimers skip each other's
row); SQLite a conditional ``UPDATE ... WHERE id = (SELECT ...) AND state = 'queued'``
inside ``BEGIN IMMEDIATE`` (one writer at a time), its row count checked. Times come from
the database's clock on PostgreSQL (workers on several hosts agree on staleness) and
from this host's UTC clock on SQLite (one file, one host).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    false,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from cloud_api.errors import Conflict, NotFound
from cloud_api.store.db import Database
from cloud_api.store.tables import BigId, as_utc, metadata

KINDS = ("retrain", "pretrain")
STATES = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED = ("succeeded", "failed", "cancelled")
LOG_TAIL_CHARS = 4000  # the last lines of a job's log kept in its row
LIVE = text("state IN ('queued', 'running')")

jobs = Table(
    "jobs", metadata,
    Column("id", BigId, primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("spec", JSON, nullable=False),              # the checked request
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),       # claims so far
    Column("max_attempts", Integer, nullable=False),
    Column("worker_id", String(128)),                  # owner while running
    Column("created_by", String(64)),                  # key id of the admin, never the key
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True)),     # first claim
    Column("claimed_at", DateTime(timezone=True)),     # claim of the current/last attempt
    Column("heartbeat_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("progress", JSON),                          # step, total, loss, dev_accuracy, ...
    Column("error", Text),
    Column("log_tail", Text),
    Column("result", JSON),                            # version, metrics, promotion decision
    Column("cancel_requested", Boolean, nullable=False),
    Column("watermark", BigId),                        # highest record id in the snapshot
    Column("reserved", String(128)),                   # a name only one live job may hold
    CheckConstraint("state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
                    name="state"),
    CheckConstraint("kind IN ('retrain', 'pretrain')", name="kind"),
    Index(None, "state", "id"),                        # claim: the oldest queued job
    Index("uq_jobs_live_kind_reserved", "kind", "reserved", unique=True,  # 0003_job_names
          sqlite_where=LIVE, postgresql_where=LIVE),
    sqlite_autoincrement=True,
)


@dataclass(frozen=True)
class Job:
    """One row of ``jobs``."""

    id: int
    kind: str
    spec: dict
    state: str
    attempts: int
    max_attempts: int
    worker_id: str | None
    created_by: str | None
    created_at: datetime | None
    started_at: datetime | None
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    finished_at: datetime | None
    progress: dict | None
    error: str | None
    log_tail: str | None
    result: dict | None
    cancel_requested: bool
    watermark: int | None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def public(self) -> dict[str, Any]:
        """What ``GET /admin/jobs/{id}`` answers."""
        out = {"job_id": self.id, "kind": self.kind, "state": self.state, "spec": self.spec,
               "attempts": self.attempts, "max_attempts": self.max_attempts,
               "worker_id": self.worker_id, "created_by": self.created_by,
               "progress": self.progress, "error": self.error, "log_tail": self.log_tail,
               "result": self.result, "cancel_requested": self.cancel_requested,
               "watermark": self.watermark,
               "version": (self.result or {}).get("version"),
               "base": (self.result or {}).get("base")}
        for name in ("created_at", "started_at", "claimed_at", "heartbeat_at", "finished_at"):
            t = getattr(self, name)
            out[name] = t.isoformat() if t is not None else None
        return out


@dataclass(frozen=True)
class Beat:
    """The answer to a heartbeat: whether the job is still ours, and whether to stop."""

    owned: bool
    cancel_requested: bool = False


def _job(row) -> Job:
    m = row._mapping
    return Job(m["id"], m["kind"], dict(m["spec"]), m["state"], m["attempts"],
               m["max_attempts"], m["worker_id"], m["created_by"], as_utc(m["created_at"]),
               as_utc(m["started_at"]), as_utc(m["claimed_at"]), as_utc(m["heartbeat_at"]),
               as_utc(m["finished_at"]), m["progress"], m["error"], m["log_tail"], m["result"],
               bool(m["cancel_requested"]), m["watermark"])


def _now(conn: Connection):
    """The current time: the database's on PostgreSQL, this host's UTC on SQLite."""
    if conn.dialect.name == "postgresql":
        return func.now()
    return datetime.now(UTC)


def _ago(conn: Connection, seconds: float):
    return _now(conn) - timedelta(seconds=seconds)


def _tail(text: str | None) -> str | None:
    return None if text is None else text[-LOG_TAIL_CHARS:]


# -- submission and reading ------------------------------------------------------------------
def enqueue(db: Database, kind: str, spec: dict, *, max_attempts: int = 2,
            created_by: str | None = None, reserve: str | None = None) -> int:
    """Insert a queued job; returns its id. ``reserve``: a name that no other live (queued
    or running) job of ``kind`` may hold; the database's unique index decides between
    concurrent submissions, the loser gets :class:`Conflict` naming the holder."""
    if kind not in KINDS:
        raise ValueError(f"unknown job kind {kind!r}")
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    try:
        with db.begin(write=True) as conn:
            res = conn.execute(insert(jobs).values(
                kind=kind, spec=spec, state="queued", attempts=0, max_attempts=max_attempts,
                created_by=created_by, created_at=_now(conn), cancel_requested=False,
                reserved=reserve))
            return int(res.inserted_primary_key[0])
    except IntegrityError:
        if reserve is None:
            raise
        holder = live_holder(db, kind, reserve)
        where = f"job {holder.id} ({holder.state})" if holder else "another job"
        raise Conflict(f"{where} already holds the {kind} name {reserve!r}") from None


def live_holder(db: Database, kind: str, name: str) -> Job | None:
    """The queued or running job of ``kind`` that reserved ``name``, if any."""
    with db.begin() as conn:
        row = conn.execute(select(jobs).where(jobs.c.kind == kind, jobs.c.reserved == name,
                                              jobs.c.state.in_(("queued", "running")))).first()
    return None if row is None else _job(row)


def get(db: Database, job_id: int) -> Job:
    """The job ``job_id``; :class:`NotFound` if there is none."""
    with db.begin() as conn:
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    if row is None:
        raise NotFound(f"no job {job_id}")
    return _job(row)


def list_jobs(db: Database, *, states: tuple[str, ...] | None = None,
              kind: str | None = None, limit: int = 100,
              before_id: int | None = None) -> list[Job]:
    """Jobs newest first, optionally only some states, one kind, ids below ``before_id``."""
    q = select(jobs).order_by(jobs.c.id.desc()).limit(limit)
    if states:
        q = q.where(jobs.c.state.in_(states))
    if kind:
        q = q.where(jobs.c.kind == kind)
    if before_id is not None:
        q = q.where(jobs.c.id < before_id)
    with db.begin() as conn:
        return [_job(r) for r in conn.execute(q)]


# -- the worker's side -----------------------------------------------------------------------
def claim(db: Database, worker_id: str) -> Job | None:
    """Atomically take the oldest queued job for ``worker_id`` (queued -> running,
    attempts + 1, heartbeat now); None when nothing is queued."""
    with db.begin(write=True) as conn:
        now = _now(conn)
        values = dict(state="running", worker_id=worker_id, attempts=jobs.c.attempts + 1,
                      claimed_at=now, heartbeat_at=now,
                      started_at=func.coalesce(jobs.c.started_at, now), progress=None)
        oldest = (select(jobs.c.id).where(jobs.c.state == "queued")
                  .order_by(jobs.c.id).limit(1))
        if conn.dialect.name == "postgresql":
            job_id = conn.execute(oldest.with_for_update(skip_locked=True)).scalar()
            if job_id is None:
                return None
            res = conn.execute(update(jobs).where(jobs.c.id == job_id,
                                                  jobs.c.state == "queued").values(**values))
            if res.rowcount != 1:
                return None
        else:  # BEGIN IMMEDIATE holds the write lock; the state check is belt and braces
            job_id = conn.execute(update(jobs).where(jobs.c.id == oldest.scalar_subquery(),
                                                     jobs.c.state == "queued")
                                  .values(**values).returning(jobs.c.id)).scalar()
            if job_id is None:
                return None
        return _job(conn.execute(select(jobs).where(jobs.c.id == job_id)).one())


def _owned(job_id: int, worker_id: str):
    return (jobs.c.id == job_id, jobs.c.worker_id == worker_id, jobs.c.state == "running")


def heartbeat(db: Database, job_id: int, worker_id: str, *, progress: dict | None = None,
              log_tail: str | None = None) -> Beat:
    """Record that ``worker_id`` is still running ``job_id`` (with the child's progress and
    log tail when given). ``Beat.owned`` False: the job is no longer ours (reaped, or
    finished elsewhere): stop working on it."""
    with db.begin(write=True) as conn:
        values: dict[str, Any] = {"heartbeat_at": _now(conn)}
        if progress is not None:
            values["progress"] = progress
        if log_tail is not None:
            values["log_tail"] = _tail(log_tail)
        res = conn.execute(update(jobs).where(*_owned(job_id, worker_id)).values(**values)
                           .returning(jobs.c.cancel_requested))
        row = res.first()
    return Beat(False) if row is None else Beat(True, bool(row[0]))


def set_watermark(db: Database, job_id: int, worker_id: str, watermark: int | None
                  ) -> int | None:
    """Keep the job's snapshot watermark: the first one set stays (a retried attempt trains
    on the same records). Returns the watermark in force; None if the job is not ours."""
    with db.begin(write=True) as conn:
        conn.execute(update(jobs).where(*_owned(job_id, worker_id), jobs.c.watermark.is_(None))
                     .values(watermark=watermark))
        row = conn.execute(select(jobs.c.watermark, jobs.c.worker_id, jobs.c.state)
                           .where(jobs.c.id == job_id)).first()
    if row is None or row.worker_id != worker_id or row.state != "running":
        return None
    return row.watermark


def finish(db: Database, job_id: int, worker_id: str, state: str, *, error: str | None = None,
           result: dict | None = None, progress: dict | None = None,
           log_tail: str | None = None) -> bool:
    """End a running job that ``worker_id`` owns; False if it was not ours any more."""
    if state not in FINISHED:
        raise ValueError(f"a job finishes as {', '.join(FINISHED)}, not {state!r}")
    with db.begin(write=True) as conn:
        values: dict[str, Any] = {"state": state, "finished_at": _now(conn), "error": error,
                                  "result": result}
        if progress is not None:
            values["progress"] = progress
        if log_tail is not None:
            values["log_tail"] = _tail(log_tail)
        res = conn.execute(update(jobs).where(*_owned(job_id, worker_id)).values(**values))
        return res.rowcount == 1


def release(db: Database, job_id: int, worker_id: str, reason: str, *,
            count_attempt: bool = False) -> bool:
    """Give a running job back to the queue, with ``reason`` in ``error``. The attempt is
    not counted (the worker is shutting down, not the job failing) unless
    ``count_attempt`` (the child was killed: a retry). False if it was not ours."""
    attempts = jobs.c.attempts if count_attempt else jobs.c.attempts - 1
    with db.begin(write=True) as conn:
        res = conn.execute(update(jobs).where(*_owned(job_id, worker_id)).values(
            state="queued", worker_id=None, attempts=attempts, error=reason, progress=None))
        return res.rowcount == 1


def reap(db: Database, timeout_s: float) -> list[tuple[int, str]]:
    """Running jobs without a heartbeat for ``timeout_s``: queued again while attempts are
    left, else failed (cancelled if a cancel was asked for), each with the reason in
    ``error``. Returns ``[(job_id, new_state)]``. Never leaves a stale job running."""
    out: list[tuple[int, str]] = []
    with db.begin(write=True) as conn:
        cutoff = _ago(conn, timeout_s)
        q = (select(jobs.c.id, jobs.c.attempts, jobs.c.max_attempts, jobs.c.worker_id,
                    jobs.c.cancel_requested)
             .where(jobs.c.state == "running", jobs.c.heartbeat_at < cutoff).order_by(jobs.c.id))
        if conn.dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        for row in conn.execute(q).all():
            lost = (f"worker {row.worker_id} sent no heartbeat for {timeout_s:g} s during "
                    f"attempt {row.attempts} of {row.max_attempts}")
            if row.cancel_requested:
                state, values = "cancelled", {"error": f"{lost}; it was being cancelled"}
            elif row.attempts < row.max_attempts:
                state, values = "queued", {"error": f"{lost}; queued again", "worker_id": None}
            else:
                state, values = "failed", {"error": f"{lost}; no attempts left"}
            if state != "queued":
                values["finished_at"] = _now(conn)
            res = conn.execute(update(jobs).where(
                jobs.c.id == row.id, jobs.c.state == "running",
                jobs.c.heartbeat_at < cutoff).values(state=state, **values))
            if res.rowcount == 1:
                out.append((row.id, state))
    return out


# -- the admin's side ------------------------------------------------------------------------
def request_cancel(db: Database, job_id: int) -> Job:
    """Cancel a job: a queued one at once, a running one at its next step (its worker sees
    ``cancel_requested`` at the next heartbeat). :class:`Conflict` for a finished job."""
    with db.begin(write=True) as conn:
        now = _now(conn)
        res = conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.state == "queued")
                           .values(state="cancelled", cancel_requested=True, finished_at=now,
                                   error="cancelled before it started"))
        if res.rowcount == 0:
            conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.state == "running",
                                            jobs.c.cancel_requested == false())
                         .values(cancel_requested=True))
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    if row is None:
        raise NotFound(f"no job {job_id}")
    job = _job(row)
    if job.state in ("succeeded", "failed") or (job.state == "cancelled" and res.rowcount == 0):
        raise Conflict(f"job {job_id} has already finished ({job.state}); nothing to cancel")
    return job
