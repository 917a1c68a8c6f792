"""The job worker: claim a job, run it in a child process, heartbeat, cancel, reap.

    worker = Worker(settings, db, home)
    worker.start()            # a thread (``cloud-api serve`` runs one by default)
    ...
    worker.stop(timeout=30)   # the running job's child is stopped and the job re-queued

``cloud-api worker`` runs the same loop in the foreground; any number of workers on any
hosts sharing the database and ``$PRIVBERT_HOME`` may run at once (claims are atomic,
``jobs/queue.py``).

Protocol of one job (steps 2-4 are ``attempt.py``, the publishing in step 4
``publisher.py``):

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
import socket
import threading
import time
from pathlib import Path

from cloud_api.errors import ServiceError
from cloud_api.home import ModelHome
from cloud_api.jobs import queue
from cloud_api.jobs.attempt import Attempt, count_ended
from cloud_api.jobs.publisher import Publisher
from cloud_api.jobs.states import AttemptEnd, JobState
from cloud_api.jobs.table import Job
from cloud_api.settings import Settings
from cloud_api.store.db import Database
from cloud_api.store.seals import DatabaseSeals

log = logging.getLogger("cloud_api.worker")


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Claims and runs jobs until stopped (see the module docstring)."""

    def __init__(self, settings: Settings, db: Database, home: ModelHome | str | os.PathLike,
                 *, worker_id: str | None = None, torchrun_nproc: int | None = None):
        self.settings, self.db = settings, db
        self.home = home if isinstance(home, ModelHome) else ModelHome(home)
        if self.home.seals is None:  # the versions it publishes: their digests recorded

            self.home.seals = DatabaseSeals(db)
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

    @property
    def stopping(self) -> bool:
        """True once asked to stop: a running child is stopped, its job queued again."""
        return self._stop.is_set()

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
                    count_ended(queue.get(self.db, job_id).kind, state)
                except ServiceError:
                    pass
        return reaped

    def run_job(self, job: Job) -> AttemptEnd:
        """Run a claimed job's attempt to its end (``attempt.py``); returns how it ended
        (``RELEASED`` when this worker was stopped, ``LOST`` when the job stopped being
        ours)."""
        try:  # a shared model store: the promoted versions and the base the job reads, here
            self.home.sync()
            base = Path(job.spec["base_path"]) if job.spec.get("base_path") else None
            if base is not None and base.parent.name == "bases" and not base.is_dir():
                self.home.base_dir(base.name)
        except ServiceError as exc:
            log.warning("job %s: the model store could not be read (%s); the job reads the "
                        "versions this host has", job.id, exc.detail)
        return Attempt(self, job).run()
