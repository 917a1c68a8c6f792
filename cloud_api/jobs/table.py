"""The ``jobs`` table (on the store's metadata; created by migrations ``0002_jobs`` and
``0003_job_names``) and :class:`Job`, one of its rows. The operations on it are
``queue.py``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
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
    text,
)

from cloud_api.jobs.states import FINISHED, JobKind, JobState
from cloud_api.store.tables import BigId, as_utc, metadata

LIVE_ROW = text("state IN ('queued', 'running')")  # as migration 0003 wrote it

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
          sqlite_where=LIVE_ROW, postgresql_where=LIVE_ROW),
    sqlite_autoincrement=True,
)


@dataclass(frozen=True)
class Job:
    """One row of ``jobs``."""

    id: int
    kind: JobKind
    spec: dict
    state: JobState
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


def job_of(row) -> Job:
    """The :class:`Job` of a row of ``jobs``."""
    m = row._mapping
    return Job(m["id"], JobKind(m["kind"]), dict(m["spec"]), JobState(m["state"]),
               m["attempts"], m["max_attempts"], m["worker_id"], m["created_by"],
               as_utc(m["created_at"]), as_utc(m["started_at"]), as_utc(m["claimed_at"]),
               as_utc(m["heartbeat_at"]), as_utc(m["finished_at"]), m["progress"], m["error"],
               m["log_tail"], m["result"], bool(m["cancel_requested"]), m["watermark"])
