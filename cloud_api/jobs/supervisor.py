"""The job worker: claim a job, run it in a child process, heartbeat, cancel, reap.

    worker = Worker(settings, db, home)
    worker.start()            # a thread (``cloud-api serve`` runs one by default)
    ...
    worker.stop(timeout=30)   # the running job's child is stopped and the job re-queued

``cloud-api worker`` runs the same loop in the foreground; any number of workers on any
hosts sharing the database and ``$PRIVBERT_HOME`` may run at once (claims are atomic,
``jobs/queue.py``).

Protocol of one job:

1. ``claim`` (queued -> running, attempts + 1); a retraining job gets its watermark,
   the highest record id of its task now (kept across retries).
2. The child ``python -m cloud_api.jobs.run ATTEMPT_DIR`` (or torchrun, DDP: ``python
   -m cloud_api.jobs.launch ATTEMPT_DIR --nproc-per-node N [torchrun_args] -m
   cloud_api.jobs.run ATTEMPT_DIR``, torchrun recording which ranks a signal killed) runs
   in its own process group, its output in the attempt's ``log.txt``: a crash, an
   out-of-memory kill or a cancel never takes this process down.
3. Every ``heartbeat_s`` the worker sends the child's progress and log tail with its
   heartbeat. A heartbeat that finds the job no longer ours stops the child. One that
   finds ``cancel_requested`` creates the cancel flag (the child stops at its next step),
   then after a grace period SIGTERM, then SIGKILL, to the child's process group.
4. The child exits. A heartbeat checks that the job is still this worker's (else its
   output is dropped: the reaper gave the job to another). With a result, the publisher
   (``publisher.py``) makes it a base, or a version promoted when the job's rule allows
   it; a comparison child it needs runs supervised like the first. A cancelled job
   registers nothing. A child killed by a signal (or, under torchrun, a child one of
   whose ranks a signal killed: ``ranks.json``) is queued again while attempts are left;
   an error fails the job with its one-line reason.
5. Every ``reaper_interval_s`` (also while a job runs) the worker reaps jobs whose
   heartbeat is older than ``heartbeat_timeout_s``: queued again or failed, never left
   running (``jobs.queue.reap``).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time

from cloud_api.errors import ServiceError
from cloud_api.home import ModelHome
from cloud_api.jobs import children, queue
from cloud_api.jobs.files import AttemptFiles
from cloud_api.jobs.publisher import Interrupted, Publisher
from cloud_api.jobs.states import AttemptEnd, ChildExit, JobKind, JobState
from cloud_api.settings import Settings
from cloud_api.store.db import Database

log = logging.getLogger("cloud_api.worker")

CANCEL_GRACE_S = 10.0   # after the cancel flag, before SIGTERM
POLL_S = 0.2            # how often the child is checked for having exited


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Claims and runs jobs until stopped (see the module docstring)."""

    def __init__(self, settings: Settings, db: Database, home: ModelHome | str | os.PathLike,
                 *, worker_id: str | None = None, torchrun_nproc: int | None = None):
        self.settings, self.db = settings, db
        self.home = home if isinstance(home, ModelHome) else ModelHome(home)
        self.id = worker_id or default_worker_id()
        self.nproc = settings.torchrun_nproc if torchrun_nproc is None else torchrun_nproc
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_reap = 0.0
        self.publisher = Publisher(self.home)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Run the claim loop in a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"job-worker {self.id}",
                                        daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Look for a job now rather than at the next poll (a job was just queued)."""
        self._wake.set()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop claiming; a running job's child is stopped and the job queued again."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self, once: bool = False) -> AttemptEnd | None:
        """The claim loop (foreground). ``once``: run at most one job and return how it
        ended (None when nothing was queued)."""
        log.info("job worker %s started (torchrun %s)", self.id, self.nproc or "off")
        while not self._stop.is_set():
            self.maybe_reap()
            try:
                job = queue.claim(self.db, self.id)
            except ServiceError as exc:  # the database is away: try again later
                log.warning("job worker %s: cannot claim (%s)", self.id, exc.detail)
                job = None
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.exception("job worker %s: claim failed", self.id)
                job = None
            if job is None:
                if once:
                    return None
                self._wake.wait(self.settings.worker_poll_s)
                self._wake.clear()
                continue
            try:
                state = self.run_job(job)
            except Exception:  # noqa: BLE001
                log.exception("job %s: the worker failed while running it", job.id)
                state = AttemptEnd.ERROR
            if once:
                return state
        log.info("job worker %s stopped", self.id)
        return None

    def maybe_reap(self, force: bool = False) -> list[tuple[int, JobState]]:
        """Reap stale jobs every ``reaper_interval_s``."""
        now = time.monotonic()
        if not force and now < self._next_reap:
            return []
        self._next_reap = now + self.settings.reaper_interval_s
        try:
            reaped = queue.reap(self.db, self.settings.heartbeat_timeout_s)
        except ServiceError as exc:
            log.warning("reaper: %s", exc.detail)
            return []
        for job_id, state in reaped:
            log.warning("reaper: job %s had no heartbeat for %g s: now %s", job_id,
                        self.settings.heartbeat_timeout_s, state)
            if state != JobState.QUEUED:
                try:
                    _count(queue.get(self.db, job_id).kind, state)
                except ServiceError:
                    pass
        return reaped

    # -- one job ------------------------------------------------------------------------------
    def run_job(self, job: queue.Job) -> AttemptEnd:
        """Run a claimed job to its end; returns how the attempt ended (``RELEASED`` when
        this worker was stopped, ``LOST`` when the job stopped being ours)."""
        files = AttemptFiles(self.home.job_dir(job.id) / f"attempt-{job.attempts}")
        log.info("job %s (%s) claimed by %s, attempt %d of %d", job.id, job.kind, self.id,
                 job.attempts, job.max_attempts)
        try:
            watermark = self._watermark(job) if job.kind == JobKind.RETRAIN else None
            files.prepare({"job_id": job.id, "kind": job.kind, "spec": job.spec,
                           "attempt": job.attempts, "watermark": watermark,
                           "worker_id": self.id})
        except _Lost:
            return AttemptEnd.LOST
        except (ServiceError, OSError) as exc:
            return self._end(job, files, JobState.FAILED,
                             error=f"cannot start: {_one_line(exc)}")
        cmd = children.child_command(files.dir, self.nproc, self.settings.torchrun_args)
        rc, outcome = self._run_child(job, files, cmd)
        return self._conclude(job, files, rc, outcome)

    def _run_child(self, job: queue.Job, files: AttemptFiles, cmd: list[str],
                   limit_s: float | None = None) -> tuple[int | None, ChildExit]:
        """Run ``cmd`` in its own process group, its output appended to the attempt's log,
        supervised (heartbeats, cancel, :meth:`_supervise`); returns (exit code, outcome)."""
        with open(files.log, "ab") as logf:
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                     stderr=subprocess.STDOUT,
                                     env=children.child_env(self.settings, self.home.root),
                                     cwd=str(files.dir), start_new_session=True)
        try:
            outcome = self._supervise(job, files, child, limit_s)
        finally:
            if child.poll() is None:
                children.kill(child)
            children.signal_group(child.pid, signal.SIGKILL)  # stray torchrun ranks, if any
        return child.returncode, outcome

    def _watermark(self, job: queue.Job) -> int:
        from cloud_api.store.records import current_watermark

        wm = job.watermark
        if wm is None:
            wm = current_watermark(self.db, job.spec["task"])
        kept = queue.set_watermark(self.db, job.id, self.id, wm)
        if kept is None:
            raise _Lost()
        return kept

    def _supervise(self, job: queue.Job, files: AttemptFiles, child: subprocess.Popen,
                   limit_s: float | None = None) -> ChildExit:
        """Wait for the child, heartbeating; returns how it ended (``TIMED_OUT`` after
        ``limit_s``)."""
        beat_every = self.settings.heartbeat_s
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
            if self._stop.is_set():
                return ChildExit.STOPPED
            if give_up is not None and now > give_up:
                return ChildExit.TIMED_OUT
            if now >= next_beat:
                next_beat = now + beat_every
                try:
                    beat = queue.heartbeat(self.db, job.id, self.id,
                                           progress=files.read_progress(),
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
                self.maybe_reap()
            if cancel_at is not None and term_at is None and now - cancel_at > CANCEL_GRACE_S:
                children.signal_group(child.pid, signal.SIGTERM)
                term_at = now
            elif term_at is not None and now - term_at > children.KILL_GRACE_S:
                children.signal_group(child.pid, signal.SIGKILL)

    def _conclude(self, job: queue.Job, files: AttemptFiles, rc: int,
                  outcome: ChildExit) -> AttemptEnd:
        if outcome in (ChildExit.STOPPED, ChildExit.LOST):
            return self._interrupted(job, files, outcome)
        stop = self._stop_before_registering(job, outcome)
        if stop is not None:
            return self._interrupted(job, files, stop)
        result = files.read_result()
        if rc == 0 and result is not None:
            try:
                result = self._publish(job, files, result)
            except Interrupted as exc:  # during the comparison with the promoted version
                return self._interrupted(job, files, exc.outcome)
            except (ServiceError, OSError, ValueError) as exc:
                return self._end(job, files, JobState.FAILED, error=f"cannot register the output: "
                                 f"{_one_line(exc)}", log_tail=files.log_tail())
            return self._end(job, files, JobState.SUCCEEDED, result=result,
                             log_tail=files.log_tail())
        killed = files.killed_rank()  # under torchrun, which exits 1 whatever killed a rank
        reason = (children.rank_reason(killed, files.read_error()) if killed else
                  files.read_error() or children.exit_reason(rc))
        if (rc < 0 or killed) and job.attempts < job.max_attempts:
            queue.release(self.db, job.id, self.id, f"{reason}; queued again",
                          count_attempt=True)
            log.warning("job %s: %s; queued again", job.id, reason)
            _discard(files)
            return AttemptEnd.QUEUED
        return self._end(job, files, JobState.FAILED, error=reason, log_tail=files.log_tail())

    def _stop_before_registering(self, job: queue.Job, outcome: ChildExit) -> ChildExit | None:
        """``LOST`` or ``CANCELLED`` when the output must not be registered, else None. Still
        ours? The reaper may have given the job to another worker while the child ran
        (heartbeats late or the database away): registering this output as well would add
        a second version, perhaps promoted. Cancelled meanwhile: nothing is registered."""
        beat = queue.Beat(False) if outcome == ChildExit.LOST else self._last_beat(job)
        if not beat.owned:
            return ChildExit.LOST
        if outcome == ChildExit.CANCELLED or beat.cancel_requested:
            return ChildExit.CANCELLED
        return None

    def _interrupted(self, job: queue.Job, files: AttemptFiles,
                     outcome: ChildExit) -> AttemptEnd:
        """End an attempt whose output is not registered: the worker ``STOPPED`` (queued
        again), the job ``LOST`` to another worker, or ``CANCELLED``."""
        if outcome == ChildExit.STOPPED:
            queue.release(self.db, job.id, self.id, f"worker {self.id} stopped; queued again")
            _discard(files)
            return AttemptEnd.RELEASED
        if outcome == ChildExit.LOST:
            log.warning("job %s is no longer ours (reaped or finished elsewhere)", job.id)
            _discard(files)
            return AttemptEnd.LOST
        step = (files.read_progress() or {}).get("step")
        return self._end(job, files, JobState.CANCELLED, log_tail=files.log_tail(),
                         error="cancelled" + (f" at step {step}" if step else "") +
                         "; no version registered")

    def _last_beat(self, job: queue.Job) -> queue.Beat:
        """A heartbeat once the child has exited; not owned when the database cannot say
        (the job is then the reaper's: queued again or failed)."""
        try:
            return queue.heartbeat(self.db, job.id, self.id)
        except ServiceError as exc:
            log.warning("job %s: cannot record its end (%s); left to the reaper", job.id,
                        exc.detail)
            return queue.Beat(False)

    def _publish(self, job: queue.Job, files: AttemptFiles, result: dict) -> dict:
        """Hand the child's result to the publisher (:class:`Interrupted` when the job
        stopped being ours, was cancelled or this worker stopped meanwhile)."""
        return self.publisher.publish(job, files, result, _Supervised(self, job, files))

    def _end(self, job: queue.Job, files: AttemptFiles, state: JobState, *,
             error: str | None = None, result: dict | None = None,
             log_tail: str | None = None) -> AttemptEnd:
        ok = queue.finish(self.db, job.id, self.id, state, error=error, result=result,
                          progress=files.read_progress(), log_tail=log_tail)
        _discard(files)
        if not ok:
            log.warning("job %s was no longer ours when it ended (%s)", job.id, state)
            return AttemptEnd.LOST
        _count(job.kind, state)
        log.info("job %s: %s%s", job.id, state, f" ({error})" if error else "")
        return AttemptEnd(state)


class _Lost(Exception):
    """The job stopped being ours before the child started."""


class _Supervised:
    """One attempt, as the publisher sees it: a comparison child runs supervised like the
    training child (heartbeats, cancel), and it asks whether the output may be
    registered (still ours, not cancelled)."""

    def __init__(self, worker: Worker, job: queue.Job, files: AttemptFiles):
        self.worker, self.job, self.files = worker, job, files

    def run_child(self, cmd: list[str], limit_s: float | None = None
                  ) -> tuple[int | None, ChildExit]:
        return self.worker._run_child(self.job, self.files, cmd, limit_s)

    def interruption(self) -> ChildExit | None:
        return self.worker._stop_before_registering(self.job, ChildExit.EXITED)


def _one_line(exc: BaseException) -> str:
    msg = exc.detail if isinstance(exc, ServiceError) else str(exc)
    return " ".join(msg.split())[:500] or type(exc).__name__


def _discard(files: AttemptFiles) -> None:
    """Remove a partial output (the log and progress stay)."""
    shutil.rmtree(files.output, ignore_errors=True)


def _count(kind: JobKind, state: JobState) -> None:
    from cloud_api.metrics import JOBS

    JOBS.labels(kind=kind, state=state).inc()
