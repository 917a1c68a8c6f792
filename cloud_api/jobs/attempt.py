"""One attempt of a claimed job on this worker: its child process, heartbeats, cancel,
and how the attempt ends (steps 2-4 of ``supervisor.py``'s protocol).

    end = Attempt(worker, job).run()   # an AttemptEnd; the job's row says the rest

The child runs in its own process group, its output appended to the attempt's
``log.txt``. While it runs, a heartbeat every ``heartbeat_s`` carries its progress and
log tail; one that finds the job no longer ours stops it, one that finds a cancel
requested creates the cancel flag, then SIGTERM after :data:`CANCEL_GRACE_S`, then
SIGKILL. Once it has exited, a last heartbeat checks the job is still ours and not
cancelled before the result goes to the publisher (``publisher.py``), which may run a
comparison child through :meth:`Attempt.run_child`, supervised the same way.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import time
from typing import Protocol

from cloud_api.errors import ServiceError
from cloud_api.home import ModelHome
from cloud_api.jobs import children, queue
from cloud_api.jobs.files import AttemptFiles
from cloud_api.jobs.publisher import Interrupted, Publisher
from cloud_api.jobs.states import AttemptEnd, ChildExit, JobKind, JobState
from cloud_api.jobs.table import Job
from cloud_api.metrics import JOBS
from cloud_api.settings import Settings
from cloud_api.store.db import Database
from cloud_api.store.snapshot import current_watermark
from edge_agent.errors import one_line

log = logging.getLogger("cloud_api.worker")  # one logger name for the whole worker

CANCEL_GRACE_S = 10.0   # after the cancel flag, before SIGTERM
POLL_S = 0.2            # how often the child is checked for having exited


class Worker(Protocol):
    """The worker running an attempt, as the attempt uses it (``supervisor.Worker``)."""

    id: str
    db: Database
    home: ModelHome
    settings: Settings
    nproc: int
    publisher: Publisher

    @property
    def stopping(self) -> bool: ...

    def maybe_reap(self, force: bool = False) -> list[tuple[int, JobState]]: ...


class Attempt:
    """The attempt ``job.attempts`` of ``job``, run by ``worker`` in
    ``$PRIVBERT_HOME/jobs/<id>/attempt-<n>/`` (:class:`AttemptFiles`)."""

    def __init__(self, worker: Worker, job: Job):
        self.worker, self.job = worker, job
        self.files = AttemptFiles(worker.home.job_dir(job.id) / f"attempt-{job.attempts}")

    def run(self) -> AttemptEnd:
        """Run the attempt to its end; ``RELEASED`` when the worker was stopped, ``LOST``
        when the job stopped being ours."""
        job, files, w = self.job, self.files, self.worker
        log.info("job %s (%s) claimed by %s, attempt %d of %d", job.id, job.kind, w.id,
                 job.attempts, job.max_attempts)
        try:
            watermark = self._watermark() if job.kind == JobKind.RETRAIN else None
            files.prepare({"job_id": job.id, "kind": job.kind, "spec": job.spec,
                           "attempt": job.attempts, "watermark": watermark,
                           "worker_id": w.id})
        except _Lost:
            return AttemptEnd.LOST
        except (ServiceError, OSError) as exc:
            return self._end(JobState.FAILED, error=f"cannot start: {one_line(exc, 500)}")
        cmd = children.child_command(files.dir, w.nproc, w.settings.torchrun_args)
        rc, outcome = self.run_child(cmd)
        return self.conclude(rc, outcome)

    def run_child(self, cmd: list[str], limit_s: float | None = None
                  ) -> tuple[int, ChildExit]:
        """Run ``cmd`` in its own process group in the attempt's folder, its output appended
        to the attempt's log, supervised (heartbeats, cancel, :meth:`_supervise`); returns
        (exit code, how it ended)."""
        w = self.worker
        with open(self.files.log, "ab") as logf:
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                     stderr=subprocess.STDOUT,
                                     env=children.child_env(w.settings, w.home.root),
                                     cwd=str(self.files.dir), start_new_session=True)
        try:
            outcome = self._supervise(child, limit_s)
        finally:
            if child.poll() is None:
                children.kill(child)
            children.signal_group(child.pid, signal.SIGKILL)  # stray torchrun ranks, if any
        return child.wait(), outcome  # it has exited: its code at once

    def interruption(self) -> ChildExit | None:
        """``LOST`` or ``CANCELLED`` when the output must not be registered now, else None
        (a heartbeat asks)."""
        return self._stop_before_registering(ChildExit.EXITED)

    def _watermark(self) -> int:
        job, w = self.job, self.worker
        wm = job.watermark
        if wm is None:
            wm = current_watermark(w.db, job.spec["task"])
        kept = queue.set_watermark(w.db, job.id, w.id, wm)
        if kept is None:
            raise _Lost()
        return kept

    def _supervise(self, child: subprocess.Popen, limit_s: float | None = None) -> ChildExit:
        """Wait for the child, heartbeating; returns how it ended (``TIMED_OUT`` after
        ``limit_s``)."""
        job, files, w = self.job, self.files, self.worker
        beat_every = w.settings.heartbeat_s
        next_beat = time.monotonic() + beat_every
        give_up = None if limit_s is None else time.monotonic() + limit_s
        cancel_at = term_at = None
        while True:
            try:
                child.wait(timeout=POLL_S)
                return ChildExit.CANCELLED if cancel_at is not None else ChildExit.EXITED
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if w.stopping:
                return ChildExit.STOPPED
            if give_up is not None and now > give_up:
                return ChildExit.TIMED_OUT
            if now >= next_beat:
                next_beat = now + beat_every
                try:
                    beat = queue.heartbeat(w.db, job.id, w.id, progress=files.read_progress(),
                                           log_tail=files.log_tail())
                except ServiceError as exc:  # keep training; the reaper decides later
                    log.warning("job %s: heartbeat failed (%s)", job.id, exc.detail)
                    beat = None
                if beat is not None and not beat.owned:
                    return ChildExit.LOST
                if beat is not None and beat.cancel_requested and cancel_at is None:
                    log.info("job %s: cancel requested; stopping at the next step", job.id)
                    files.request_cancel()
                    cancel_at = now
                w.maybe_reap()
            if cancel_at is not None and term_at is None and now - cancel_at > CANCEL_GRACE_S:
                children.signal_group(child.pid, signal.SIGTERM)
                term_at = now
            elif term_at is not None and now - term_at > children.KILL_GRACE_S:
                children.signal_group(child.pid, signal.SIGKILL)

    def conclude(self, rc: int, outcome: ChildExit) -> AttemptEnd:
        """End the attempt after its child: publish its result, retry it, or fail it."""
        job, files, w = self.job, self.files, self.worker
        if outcome in (ChildExit.STOPPED, ChildExit.LOST):
            return self._interrupted(outcome)
        stop = self._stop_before_registering(outcome)
        if stop is not None:
            return self._interrupted(stop)
        result = files.read_result()
        if rc == 0 and result is not None:
            try:
                result = w.publisher.publish(self, result)
            except Interrupted as exc:  # during the comparison with the promoted version
                return self._interrupted(exc.outcome)
            except (ServiceError, OSError, ValueError) as exc:
                return self._end(JobState.FAILED, log_tail=files.log_tail(),
                                 error=f"cannot register the output: {one_line(exc, 500)}")
            return self._end(JobState.SUCCEEDED, result=result, log_tail=files.log_tail())
        killed = files.killed_rank()  # under torchrun, which exits 1 whatever killed a rank
        reason = (children.rank_reason(killed, files.read_error()) if killed else
                  files.read_error() or children.exit_reason(rc))
        if (rc < 0 or killed) and job.attempts < job.max_attempts:
            queue.release(w.db, job.id, w.id, f"{reason}; queued again", count_attempt=True)
            log.warning("job %s: %s; queued again", job.id, reason)
            _discard(files)
            return AttemptEnd.QUEUED
        return self._end(JobState.FAILED, error=reason, log_tail=files.log_tail())

    def _stop_before_registering(self, outcome: ChildExit) -> ChildExit | None:
        """``LOST`` or ``CANCELLED`` when the output must not be registered, else None. Still
        ours? The reaper may have given the job to another worker while the child ran
        (heartbeats late or the database away): registering this output as well would add
        a second version, perhaps promoted. Cancelled meanwhile: nothing is registered."""
        beat = queue.Beat(False) if outcome == ChildExit.LOST else self._last_beat()
        if not beat.owned:
            return ChildExit.LOST
        if outcome == ChildExit.CANCELLED or beat.cancel_requested:
            return ChildExit.CANCELLED
        return None

    def _interrupted(self, outcome: ChildExit) -> AttemptEnd:
        """End an attempt whose output is not registered: the worker ``STOPPED`` (queued
        again), the job ``LOST`` to another worker, or ``CANCELLED``."""
        job, files, w = self.job, self.files, self.worker
        if outcome == ChildExit.STOPPED:
            queue.release(w.db, job.id, w.id, f"worker {w.id} stopped; queued again")
            _discard(files)
            return AttemptEnd.RELEASED
        if outcome == ChildExit.LOST:
            log.warning("job %s is no longer ours (reaped or finished elsewhere)", job.id)
            _discard(files)
            return AttemptEnd.LOST
        step = (files.read_progress() or {}).get("step")
        return self._end(JobState.CANCELLED, log_tail=files.log_tail(),
                         error="cancelled" + (f" at step {step}" if step else "") +
                         "; no version registered")

    def _last_beat(self) -> queue.Beat:
        """A heartbeat once the child has exited; not owned when the database cannot say
        (the job is then the reaper's: queued again or failed)."""
        try:
            return queue.heartbeat(self.worker.db, self.job.id, self.worker.id)
        except ServiceError as exc:
            log.warning("job %s: cannot record its end (%s); left to the reaper", self.job.id,
                        exc.detail)
            return queue.Beat(False)

    def _end(self, state: JobState, *, error: str | None = None, result: dict | None = None,
             log_tail: str | None = None) -> AttemptEnd:
        job, files, w = self.job, self.files, self.worker
        ok = queue.finish(w.db, job.id, w.id, state, error=error, result=result,
                          progress=files.read_progress(), log_tail=log_tail)
        _discard(files)
        if not ok:
            log.warning("job %s was no longer ours when it ended (%s)", job.id, state)
            return AttemptEnd.LOST
        count_ended(job.kind, state)
        log.info("job %s: %s%s", job.id, state, f" ({error})" if error else "")
        return AttemptEnd(state)


class _Lost(Exception):
    """The job stopped being ours before the child started."""


def count_ended(kind: JobKind, state: JobState) -> None:
    """One more job of ``kind`` ended as ``state`` (the ``privbert_jobs_finished`` counter)."""
    JOBS.labels(kind=kind, state=state).inc()


def _discard(files: AttemptFiles) -> None:
    """Remove a partial output (the log and progress stay)."""
    shutil.rmtree(files.output, ignore_errors=True)
