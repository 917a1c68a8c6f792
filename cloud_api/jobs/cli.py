"""``cloud-api worker [--torchrun N] [--once]``: run retraining and pretraining jobs.

    PRIVBERT_HOME=/srv/privbert PRIVBERT_DATABASE_URL=postgresql+psycopg://... cloud-api worker

Claims jobs from the job table (``cloud_api/jobs/queue.py``) and runs each in a child
process (``python -m cloud_api.jobs.run``), or with ``--torchrun N`` (or
``PRIVBERT_TORCHRUN_NPROC``) as ``torchrun --nproc-per-node N [PRIVBERT_TORCHRUN_ARGS] -m
cloud_api.jobs.run`` (PyTorch DDP: gloo on CPU, nccl on GPU). Start as many workers as
wanted, on any hosts that share the database and ``$PRIVBERT_HOME``. SIGTERM or Ctrl-C:
the running job's child is stopped and the job goes back to the queue.
"""

from __future__ import annotations

import argparse
import signal
from dataclasses import dataclass

from cloud_api import logs
from cloud_api.cli import fail, guarded, home_arg, settings_for
from cloud_api.jobs.states import AttemptEnd
from cloud_api.jobs.supervisor import Worker
from cloud_api.store.db import Database
from cloud_api.store.stored_home import open_home
from models.cli.options import parsed


@dataclass(frozen=True)
class WorkerOptions:
    """``cloud-api worker``."""

    torchrun: int | None
    once: bool
    worker_id: str | None
    home: str | None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("worker", help="run queued retraining and pretraining jobs",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--torchrun", type=int, metavar="N", default=None,
                   help="train with torchrun --nproc-per-node N (DDP); 0 = one process "
                   "(default $PRIVBERT_TORCHRUN_NPROC, else 0)")
    p.add_argument("--once", action="store_true", help="run at most one queued job, then "
                   "exit (exit code 1 unless it succeeded)")
    p.add_argument("--worker-id", metavar="ID", help="name in the job table (default "
                   "host:pid:random)")
    home_arg(p)
    p.set_defaults(func=guarded(run_worker, parsed(WorkerOptions)))


def run_worker(o: WorkerOptions) -> int:
    if o.torchrun is not None and o.torchrun < 0:
        return fail(f"--torchrun must be >= 0, got {o.torchrun}")
    settings = settings_for(o.home)

    logs.configure(settings.log_level, settings.log_json)
    db = Database.from_settings(settings)
    try:
        try:
            db.prepare()  # migrations (SQLite) or a check that the schema is current
        except RuntimeError as exc:  # behind the code's head: run `cloud-api db upgrade`
            return fail(str(exc))
        worker = Worker(settings, db, open_home(settings, db), worker_id=o.worker_id,
                        torchrun_nproc=o.torchrun)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.request_stop())
        state = worker.run(once=o.once)
    finally:
        db.dispose()
    if o.once:
        return 0 if state in (None, AttemptEnd.SUCCEEDED) else 1
    return 0
