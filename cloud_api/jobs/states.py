"""The words of the job queue, as enums whose values are the strings stored and answered.

``JobKind`` and ``JobState`` are what the ``jobs`` table holds (its check constraints,
migration ``0002_jobs``) and what ``GET /admin/jobs`` answers; being ``StrEnum``, each
member equals its string, so rows written before these enums existed read back as the
same members. ``ChildExit`` says how supervising one child process ended, ``AttemptEnd``
how one attempt of a job ended for the worker that ran it: the two vocabularies overlap
in words ("cancelled", "lost"), never in type.
"""

from __future__ import annotations

from enum import StrEnum


class JobKind(StrEnum):
    RETRAIN = "retrain"
    PRETRAIN = "pretrain"


class JobState(StrEnum):
    """``queued -> running -> succeeded | failed | cancelled``; a running job whose worker
    stopped heartbeating goes back to ``queued`` while attempts are left."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED


FINISHED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
LIVE = (JobState.QUEUED, JobState.RUNNING)  # a job a worker may still run


class ChildExit(StrEnum):
    """How the supervision of one child process (training or comparison) ended."""

    EXITED = "exited"        # on its own; its exit code and files say how it went
    CANCELLED = "cancelled"  # it exited after a cancel was requested
    STOPPED = "stopped"      # this worker is stopping: the child was stopped
    LOST = "lost"            # the job is no longer this worker's: the child was stopped
    TIMED_OUT = "timed out"  # still running at its time limit: the child was stopped

    @property
    def interrupted(self) -> bool:
        """True when the attempt's output must not be registered."""
        return self in (ChildExit.CANCELLED, ChildExit.STOPPED, ChildExit.LOST)


class AttemptEnd(StrEnum):
    """What :meth:`Worker.run_job` returns: the job's state after the attempt, or why this
    worker let the job go."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    QUEUED = "queued"      # the child was killed by a signal: queued again for a retry
    RELEASED = "released"  # this worker stopped: queued again, the attempt not counted
    LOST = "lost"          # the job stopped being this worker's (reaped, or ended elsewhere)
    ERROR = "error"        # the worker itself failed while running it (left to the reaper)
