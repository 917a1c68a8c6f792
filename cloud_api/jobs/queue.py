"""The job queue: retraining and pretraining jobs in one table, shared by every worker.

    job_id = enqueue(db, JobKind.RETRAIN, {"task": "sst2", ...}, max_attempts=2)
    job = claim(db, "host:pid:thread")          # atomically queued -> running, or None
    beat = heartbeat(db, job.id, job.worker_id, progress={"step": 10, "total": 90})
    if beat.cancel_requested: ...               # stop the child, then
    finish(db, job.id, job.worker_id, JobState.CANCELLED)
    reap(db, timeout_s=30)                      # stale running jobs: queued again or failed

States (``states.JobState``): ``queued -> running -> succeeded | failed | cancelled``;
a running job whose worker stopped heartbeating goes back to ``queued`` while
``attempts < max_attempts``, else to ``failed`` with the reason. Every change of a running
job is conditional on the worker that owns it (``worker_id``) and on its state, so a
worker that lost its job (the reaper gave it to another) can neither heartbeat nor
finish it. The table and its row type are ``table.py``.

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

from sqlalchemy import false, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from cloud_api.errors import Conflict, NotFound
from cloud_api.jobs.states import FINISHED, LIVE, JobKind, JobState
from cloud_api.jobs.table import Job, job_of, jobs
from cloud_api.store.db import Database

LOG_TAIL_CHARS = 4000  # the last lines of a job's log kept in its row


@dataclass(frozen=True)
class Beat:
    """The answer to a heartbeat: whether the job is still ours, and whether to stop."""

    owned: bool
    cancel_requested: bool = False


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
def enqueue(db: Database, kind: JobKind | str, spec: dict, *, max_attempts: int = 2,
            created_by: str | None = None, reserve: str | None = None) -> int:
    """Insert a queued job; returns its id. ``reserve``: a name that no other live (queued
    or running) job of ``kind`` may hold; the database's unique index decides between
    concurrent submissions, the loser gets :class:`Conflict` naming the holder."""
    if kind not in set(JobKind):
        raise ValueError(f"unknown job kind {kind!r}")
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    try:
        with db.begin(write=True) as conn:
            res = conn.execute(insert(jobs).values(
                kind=kind, spec=spec, state=JobState.QUEUED, attempts=0, max_attempts=max_attempts,
                created_by=created_by, created_at=_now(conn), cancel_requested=False,
                reserved=reserve))
            key = res.inserted_primary_key
            assert key is not None  # a single-row insert returns its key
            return int(key[0])
    except IntegrityError:
        if reserve is None:
            raise
        holder = live_holder(db, kind, reserve)
        where = f"job {holder.id} ({holder.state})" if holder else "another job"
        raise Conflict(f"{where} already holds the {kind} name {reserve!r}") from None


def live_holder(db: Database, kind: JobKind | str, name: str) -> Job | None:
    """The queued or running job of ``kind`` that reserved ``name``, if any."""
    with db.begin() as conn:
        row = conn.execute(select(jobs).where(jobs.c.kind == kind, jobs.c.reserved == name,
                                              jobs.c.state.in_(LIVE))).first()
    return None if row is None else job_of(row)


def get(db: Database, job_id: int) -> Job:
    """The job ``job_id``; :class:`NotFound` if there is none."""
    with db.begin() as conn:
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    if row is None:
        raise NotFound(f"no job {job_id}")
    return job_of(row)


def list_jobs(db: Database, *, states: tuple[JobState | str, ...] | None = None,
              kind: JobKind | str | None = None, limit: int = 100,
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
        return [job_of(r) for r in conn.execute(q)]


# -- the worker's side -----------------------------------------------------------------------
def claim(db: Database, worker_id: str) -> Job | None:
    """Atomically take the oldest queued job for ``worker_id`` (queued -> running,
    attempts + 1, heartbeat now); None when nothing is queued."""
    with db.begin(write=True) as conn:
        now = _now(conn)
        values = dict(state=JobState.RUNNING, worker_id=worker_id, attempts=jobs.c.attempts + 1,
                      claimed_at=now, heartbeat_at=now,
                      started_at=func.coalesce(jobs.c.started_at, now), progress=None)
        oldest = (select(jobs.c.id).where(jobs.c.state == JobState.QUEUED)
                  .order_by(jobs.c.id).limit(1))
        if conn.dialect.name == "postgresql":
            job_id = conn.execute(oldest.with_for_update(skip_locked=True)).scalar()
            if job_id is None:
                return None
            res = conn.execute(update(jobs).where(jobs.c.id == job_id,
                                                  jobs.c.state == JobState.QUEUED)
                               .values(**values))
            if res.rowcount != 1:
                return None
        else:  # BEGIN IMMEDIATE holds the write lock; the state check is belt and braces
            job_id = conn.execute(update(jobs).where(jobs.c.id == oldest.scalar_subquery(),
                                                     jobs.c.state == JobState.QUEUED)
                                  .values(**values).returning(jobs.c.id)).scalar()
            if job_id is None:
                return None
        return job_of(conn.execute(select(jobs).where(jobs.c.id == job_id)).one())


def _owned(job_id: int, worker_id: str):
    return (jobs.c.id == job_id, jobs.c.worker_id == worker_id,
            jobs.c.state == JobState.RUNNING)


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
    if row is None or row.worker_id != worker_id or row.state != JobState.RUNNING:
        return None
    return row.watermark


def finish(db: Database, job_id: int, worker_id: str, state: JobState, *, error: str | None = None,
           result: dict | None = None, progress: dict | None = None,
           log_tail: str | None = None) -> bool:
    """End a running job that ``worker_id`` owns; False if it was not ours any more."""
    if state not in FINISHED:
        raise ValueError(f"a job finishes as succeeded, failed or cancelled, not {state!r}")
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
            state=JobState.QUEUED, worker_id=None, attempts=attempts, error=reason, progress=None))
        return res.rowcount == 1


def reap(db: Database, timeout_s: float) -> list[tuple[int, JobState]]:
    """Running jobs without a heartbeat for ``timeout_s``: queued again while attempts are
    left, else failed (cancelled if a cancel was asked for), each with the reason in
    ``error``. Returns ``[(job_id, new_state)]``. Never leaves a stale job running."""
    out: list[tuple[int, JobState]] = []
    with db.begin(write=True) as conn:
        cutoff = _ago(conn, timeout_s)
        q = (select(jobs.c.id, jobs.c.attempts, jobs.c.max_attempts, jobs.c.worker_id,
                    jobs.c.cancel_requested)
             .where(jobs.c.state == JobState.RUNNING, jobs.c.heartbeat_at < cutoff)
             .order_by(jobs.c.id))
        if conn.dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        for row in conn.execute(q).all():
            lost = (f"worker {row.worker_id} sent no heartbeat for {timeout_s:g} s during "
                    f"attempt {row.attempts} of {row.max_attempts}")
            values: dict[str, str | None]
            if row.cancel_requested:
                state, values = JobState.CANCELLED, {"error": f"{lost}; it was being cancelled"}
            elif row.attempts < row.max_attempts:
                state = JobState.QUEUED
                values = {"error": f"{lost}; queued again", "worker_id": None}
            else:
                state, values = JobState.FAILED, {"error": f"{lost}; no attempts left"}
            if state != JobState.QUEUED:
                values["finished_at"] = _now(conn)
            res = conn.execute(update(jobs).where(
                jobs.c.id == row.id, jobs.c.state == JobState.RUNNING,
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
        res = conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.state == JobState.QUEUED)
                           .values(state=JobState.CANCELLED, cancel_requested=True, finished_at=now,
                                   error="cancelled before it started"))
        if res.rowcount == 0:
            conn.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.state == JobState.RUNNING,
                                            jobs.c.cancel_requested == false())
                         .values(cancel_requested=True))
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    if row is None:
        raise NotFound(f"no job {job_id}")
    job = job_of(row)
    if job.state in (JobState.SUCCEEDED, JobState.FAILED) or (
            job.state == JobState.CANCELLED and res.rowcount == 0):
        raise Conflict(f"job {job_id} has already finished ({job.state}); nothing to cancel")
    return job
