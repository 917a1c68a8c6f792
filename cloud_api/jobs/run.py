"""The child process of a job: ``python -m cloud_api.jobs.run ATTEMPT_DIR``.

The worker starts it (or ``torchrun --nproc-per-node N ... -m cloud_api.jobs.run
ATTEMPT_DIR`` for DDP) with ``PRIVBERT_HOME`` and ``PRIVBERT_DATABASE_URL`` in its
environment, its stdout and stderr going to ``ATTEMPT_DIR/log.txt``. It reads
``job.json``, trains, and leaves ``result.json`` (exit 0), or ``error.txt`` (exit 1), or
stops at the next step once ``ATTEMPT_DIR/cancel`` exists (exit 3). It never registers
anything: the worker does that after checking that the job is still its own.

When the worker process dies (SIGKILL, out of memory), the child notices within a
second (``PRIVBERT_JOB_PARENT_PID``, watched with a pidfd) and exits, so that a retry of
the job never races an orphan.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
import time
import traceback
from pathlib import Path

from cloud_api.errors import ServiceError
from cloud_api.jobs import pretrain, retrain
from cloud_api.jobs.files import EXIT_CANCELLED, AttemptFiles
from cloud_api.settings import Settings

EXIT_FAILED, EXIT_ORPHANED = 1, 4
PARENT_ENV = "PRIVBERT_JOB_PARENT_PID"
TASKS = {"retrain": retrain, "pretrain": pretrain}  # a job's kind -> the module that runs it
log = logging.getLogger("cloud_api.jobs.run")


def describe(exc: BaseException) -> str:
    """One line about an error, never with input values (pydantic errors without input)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        errs = exc.errors(include_input=False, include_url=False)
        msg = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errs[:3])
        return f"ValidationError: {len(errs)} error(s): {msg}"
    msg = exc.detail if isinstance(exc, ServiceError) else str(exc)
    return f"{type(exc).__name__}: {' '.join(msg.split())}"[:1000]


def watch_parent(pid: int) -> None:
    """Exit the whole process as soon as process ``pid`` (the worker) is gone."""

    def watch() -> None:
        fd = None
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            pass
        except (AttributeError, OSError):  # no pidfd here: poll
            while True:
                time.sleep(1.0)
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    continue
        else:
            select.select([fd], [], [])  # readable when the process has exited
        print(f"job: the worker process {pid} is gone; stopping", file=sys.stderr, flush=True)
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def start_child(module: str, argv: list[str] | None, *extra: str
                ) -> tuple[AttemptFiles, list[str]] | None:
    """The set-up of a job's child process (``jobs.run``, ``jobs.compare``): the arguments
    ``ATTEMPT_DIR *extra``, logging to stderr (the attempt's log), and the watch on the
    worker process. Returns (the attempt's files, the arguments after ATTEMPT_DIR), or
    None after printing the usage when the arguments do not fit."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 + len(extra):
        print(f"usage: python -m {module} {' '.join(('ATTEMPT_DIR', *extra))}",
              file=sys.stderr)
        return None
    rank = os.environ.get("RANK")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=(
        "%(asctime)s %(levelname)s " + (f"rank {rank} " if rank else "") + "%(message)s"))
    if os.environ.get(PARENT_ENV):
        watch_parent(int(os.environ[PARENT_ENV]))
    return AttemptFiles(Path(argv[0])), argv[1:]


def main(argv: list[str] | None = None) -> int:
    started = start_child("cloud_api.jobs.run", argv)
    if started is None:
        return 2
    files, _ = started
    job = files.read_job()
    ctx = None
    finished = False  # every rank reached the end: they may meet at one last barrier
    try:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torch only when distributed
            # lazy: torch, only for a distributed job
            from models.training import distributed

            ctx = distributed.init_from_env(Settings().device)
        log.info("job %s (%s), attempt %s%s", job["job_id"], job["kind"], job["attempt"],
                 f", DDP {ctx.world_size} processes ({ctx.backend})" if ctx else "")
        task = TASKS.get(job["kind"])
        if task is None:
            raise ValueError(f"unknown job kind {job['kind']!r}")
        result = task.run(job, files, ctx)
        if result is not None:
            files.write_result(result)
        log.info("job %s: done", job["job_id"])
        finished = True
        return 0
    except BaseException as exc:  # noqa: BLE001 - report every failure as one line
        if _is_cancel(exc):
            log.info("job %s: cancelled", job["job_id"])
            return EXIT_CANCELLED
        if isinstance(exc, KeyboardInterrupt | SystemExit) and not files.cancelled():
            files.write_error("stopped by a signal")
            raise
        files.write_error(describe(exc))
        print("".join(traceback.format_tb(exc.__traceback__)) + describe(exc),
              file=sys.stderr, flush=True)
        return EXIT_CANCELLED if files.cancelled() else EXIT_FAILED
    finally:
        if ctx is not None:
            # lazy: torch, only for a distributed job
            from models.training import distributed

            distributed.close(ctx, wait_for_peers=finished)


def _is_cancel(exc: BaseException) -> bool:
    """``models.training.finetune.TrainingCancelled`` (if that module was ever imported)."""
    finetune = sys.modules.get("models.training.finetune")
    return finetune is not None and isinstance(exc, finetune.TrainingCancelled)


if __name__ == "__main__":
    sys.exit(main())
