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
   output is dropped: the reaper gave the job to another). With a result, the worker
   registers the version (``ModelHome.register``) and promotes it when the child's
   decision says so, holding the model's promotion lock (``ModelHome.promotion_lock``)
   from reading the pointer to writing it, so two jobs finishing together never both
   promote over the same version. If the promoted version is no longer the one the child
   compared with (another job or an admin promoted one meanwhile), the comparison child
   ``python -m cloud_api.jobs.compare ATTEMPT_DIR VERSION`` (supervised like the first,
   heartbeats and cancel included) measures the now-promoted version on the job's test
   rows, and ``promotion_decision`` decides again; if it fails, nothing is promoted. Then
   ownership and cancel are checked again before registering. The result's
   ``compared_with`` names the version finally compared with (``at_training``: the
   child's), ``promoted`` and ``promotion`` what was decided and why. A pretraining job's
   output becomes
   ``bases/<name>``. A cancelled job registers nothing. A child killed by a signal (or,
   under torchrun, a child one of whose ranks a signal killed: ``ranks.json``) is queued
   again while attempts are left; an error fails the job with its one-line reason.
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
import sys
import threading
import time
from pathlib import Path

from cloud_api.errors import Conflict, ServiceError
from cloud_api.home import ModelHome
from cloud_api.jobs import queue
from cloud_api.jobs.files import AttemptFiles
from cloud_api.jobs.run import PARENT_ENV
from cloud_api.jobs.states import AttemptEnd, ChildExit, JobKind, JobState
from cloud_api.settings import Settings
from cloud_api.store.db import Database

log = logging.getLogger("cloud_api.worker")

CANCEL_GRACE_S = 10.0   # after the cancel flag, before SIGTERM
KILL_GRACE_S = 5.0      # after SIGTERM, before SIGKILL
POLL_S = 0.2            # how often the child is checked for having exited
COMPARE_TIMEOUT_S = 1800.0  # the comparison child holds the promotion lock: not forever
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the repository (children import from it)
SECRET_ENV = ("PRIVBERT_API_KEYS", "PRIVBERT_ADMIN_KEYS", "PRIVBERT_KEYS_FILE",
              "PRIVBERT_TEXTHIDE_KEY")


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def child_command(attempt_dir: Path, nproc: int = 0, torchrun_args: str = "") -> list[str]:
    """The child's command line: one process, or ``torchrun`` with ``nproc`` per node
    (``--standalone`` unless rendezvous flags are given in ``torchrun_args``)."""
    import shlex

    run = ["-m", "cloud_api.jobs.run", str(attempt_dir)]
    if nproc <= 0:
        return [sys.executable, *run]
    extra = shlex.split(torchrun_args) or ["--standalone"]
    return [sys.executable, "-m", "cloud_api.jobs.launch", str(attempt_dir),  # torchrun that
            "--nproc-per-node", str(nproc), *extra, *run]          # records killed ranks


def compare_command(attempt_dir: Path, version: str) -> list[str]:
    """The comparison child's command line (one process): VERSION on the job's test rows."""
    return [sys.executable, "-m", "cloud_api.jobs.compare", str(attempt_dir), version]


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_reason(rc: int, what: str = "training") -> str:
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else -rc
        hint = " (out of memory?)" if rc == -signal.SIGKILL else ""
        return f"the {what} process was killed by {name}{hint}"
    return f"the {what} process exited with code {rc}"


def _rank_reason(killed: dict, error: str | None) -> str:
    """Why a torchrun child failed when a signal killed one of its ranks (the other ranks'
    errors, e.g. a lost connection to it, are consequences)."""
    hint = " (out of memory?)" if killed.get("signal") == "SIGKILL" else ""
    then = f"; then: {error}" if error else ""
    return (f"torchrun rank {killed.get('rank')} was killed by "
            f"{killed.get('signal') or killed.get('exitcode')}{hint}{then}")[:1000]


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
        cmd = child_command(files.dir, self.nproc, self.settings.torchrun_args)
        rc, outcome = self._run_child(job, files, cmd)
        return self._conclude(job, files, rc, outcome)

    def _run_child(self, job: queue.Job, files: AttemptFiles, cmd: list[str],
                   limit_s: float | None = None) -> tuple[int | None, ChildExit]:
        """Run ``cmd`` in its own process group, its output appended to the attempt's log,
        supervised (heartbeats, cancel, :meth:`_supervise`); returns (exit code, outcome)."""
        with open(files.log, "ab") as logf:
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                     stderr=subprocess.STDOUT, env=self._child_env(),
                                     cwd=str(files.dir), start_new_session=True)
        try:
            outcome = self._supervise(job, files, child, limit_s)
        finally:
            if child.poll() is None:
                self._kill(child)
            _signal_group(child.pid, signal.SIGKILL)  # stray torchrun ranks, if any
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

    def _child_env(self) -> dict[str, str]:
        s = self.settings
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        env.update({"PRIVBERT_HOME": str(Path(self.home.root).resolve()),
                    "PRIVBERT_DATABASE_URL": s.resolved_database_url,
                    "PRIVBERT_DEVICE": s.device, "PRIVBERT_PRECISION": s.precision,
                    "PRIVBERT_DB_BUSY_TIMEOUT_S": str(s.db_busy_timeout_s),
                    "PRIVBERT_DB_CONNECT_TIMEOUT_S": str(s.db_connect_timeout_s),
                    PARENT_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)})
        if s.pretrain_corpus is not None:
            env["PRIVBERT_PRETRAIN_CORPUS"] = str(Path(s.pretrain_corpus).resolve())
        return env

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
                _signal_group(child.pid, signal.SIGTERM)
                term_at = now
            elif term_at is not None and now - term_at > KILL_GRACE_S:
                _signal_group(child.pid, signal.SIGKILL)

    def _kill(self, child: subprocess.Popen) -> None:
        _signal_group(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(child.pid, signal.SIGKILL)
            child.wait()

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
            except _Interrupted as exc:  # during the comparison with the promoted version
                return self._interrupted(job, files, exc.outcome)
            except (ServiceError, OSError, ValueError) as exc:
                return self._end(job, files, JobState.FAILED, error=f"cannot register the output: "
                                 f"{_one_line(exc)}", log_tail=files.log_tail())
            return self._end(job, files, JobState.SUCCEEDED, result=result,
                             log_tail=files.log_tail())
        killed = files.killed_rank()  # under torchrun, which exits 1 whatever killed a rank
        reason = (_rank_reason(killed, files.read_error()) if killed else
                  files.read_error() or _exit_reason(rc))
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
        """Register the child's output (a model version, or a base), promote when decided."""
        if job.kind == JobKind.PRETRAIN:
            name = job.spec["name"]
            dest = self.home.base_dir(name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                dest.mkdir()  # reserve the name atomically
            except FileExistsError:
                raise Conflict(f"a base named {name!r} appeared meanwhile") from None
            os.replace(files.output, dest)
            return {**result, "base": name}
        model_id = job.spec["model_id"]
        promoted, reason = False, result["promote"]["reason"]
        if not result["promote"]["decision"]:
            version = self.home.register(model_id, files.output, move=True)
        else:
            with self.home.promotion_lock(model_id):  # nothing changes the pointer meanwhile
                now = self.home.promoted(model_id)
                if now == result["compared_with"]["version"]:
                    promoted = True
                else:  # another job or an admin promoted a version while this job ran
                    result = self._compare_again(job, files, result, now)
                    promoted, reason = _decide_again(result)
                    stop = self._stop_before_registering(job, ChildExit.EXITED)
                    if stop is not None:
                        raise _Interrupted(stop)
                version = self.home.register(model_id, files.output, move=True)
                if promoted:
                    self.home.write_promoted(model_id, version)
        log.info("job %s: registered %s %s%s", job.id, model_id, version,
                 " and promoted it" if promoted else f", not promoted: {reason}")
        return {**result, "version": version, "promoted": promoted, "promotion": reason}

    def _compare_again(self, job: queue.Job, files: AttemptFiles, result: dict,
                       now: str | None) -> dict:
        """``result`` with ``compared_with`` the version promoted ``now``: its accuracy on
        the job's test rows, measured by the comparison child (``jobs/compare.py``; the
        caller holds the promotion lock). The child's own comparison moves to
        ``compared_with.at_training``. Raises :class:`_Interrupted` when the job is
        cancelled, lost or the worker stopped meanwhile."""
        n_test = result["records"]["test"]
        found: dict = {"version": now, "test_accuracy": None, "error": None}
        if now is not None and n_test and result["metrics"]["test_accuracy"] is not None:
            log.info("job %s: the promoted version is now %s; comparing with it", job.id, now)
            files.comparison.unlink(missing_ok=True)
            rc, outcome = self._run_child(job, files, compare_command(files.dir, now),
                                          COMPARE_TIMEOUT_S)
            if outcome.interrupted:
                raise _Interrupted(outcome)
            out = files.read_comparison() or {}
            if outcome == ChildExit.TIMED_OUT:
                found["error"] = f"no answer within {COMPARE_TIMEOUT_S:g} s"
            elif rc == 0 and out.get("test_records") != n_test:
                found["error"] = (f"the job's test records changed since it trained ({n_test} "
                                  f"then, {out.get('test_records')} now: erased?)")
            elif rc == 0 and out.get("test_accuracy") is not None:
                found["test_accuracy"] = out["test_accuracy"]
            else:
                found["error"] = out.get("error") or _exit_reason(rc, "comparison")
        return {**result, "compared_with": {**found, "at_training": result["compared_with"]}}

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


def _decide_again(result: dict) -> tuple[bool, str]:
    """``promotion_decision`` (the job's own rule) against the version compared again."""
    from cloud_api.jobs.retrain import promotion_decision

    now, before = result["compared_with"], result["compared_with"]["at_training"]
    promote, why = promotion_decision(True, result["metrics"]["test_accuracy"],
                                      now["version"], now["test_accuracy"],
                                      result["records"]["test"], now["error"])
    return promote, (f"{'' if promote else 'not promoted: '}the promoted version "
                     f"changed while the job ran ({before['version'] or 'none'} -> "
                     f"{now['version'] or 'none'}, another job or an admin promoted it); "
                     f"compared again with {now['version'] or 'none'}: {why}")


class _Lost(Exception):
    """The job stopped being ours before the child started."""


class _Interrupted(Exception):
    """The comparison with the promoted version ended early: the job was cancelled or
    lost, or the worker stopped; nothing is registered."""

    def __init__(self, outcome: ChildExit):
        super().__init__(outcome)
        self.outcome = outcome


def _one_line(exc: BaseException) -> str:
    msg = exc.detail if isinstance(exc, ServiceError) else str(exc)
    return " ".join(msg.split())[:500] or type(exc).__name__


def _discard(files: AttemptFiles) -> None:
    """Remove a partial output (the log and progress stay)."""
    shutil.rmtree(files.output, ignore_errors=True)


def _count(kind: JobKind, state: JobState) -> None:
    from cloud_api.metrics import JOBS

    JOBS.labels(kind=kind, state=state).inc()
