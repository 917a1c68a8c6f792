"""The comparison child: ``python -m cloud_api.jobs.compare ATTEMPT_DIR VERSION``.

The publisher runs it (``publisher.py``; no lock held) when the promoted version changed
while a retraining job ran: it loads the job's test rows again (the task and watermark of
``job.json``, the same split by record id, :func:`retrain.split_rows`) and measures
VERSION's accuracy on them, as the job measured the version promoted when it trained. It writes ``compare.json`` and exits 0:
``{"version", "test_accuracy", "test_records", "watermark"}``, or exits 1 with
``{"version", "error"}``; exits 3 as soon as the cancel flag appears, and 4 when the
worker is gone (``run.watch_parent``). Nothing here logs a payload.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from cloud_api.home import ModelHome
from cloud_api.jobs.files import EXIT_CANCELLED, AttemptFiles, ProgressWriter, write_json_atomically
from cloud_api.jobs.retrain import load_snapshot, split_rows
from cloud_api.jobs.run import EXIT_FAILED, describe, start_child
from cloud_api.settings import Settings

log = logging.getLogger("cloud_api.jobs.compare")


def measure(job: dict, version: str) -> dict:
    """VERSION's accuracy on the job's test rows (the database and ``$PRIVBERT_HOME`` of
    the environment, as for ``jobs.run``)."""

    settings = Settings()
    spec = job["spec"]
    _task, rows, watermark = load_snapshot(settings, spec["task"], job.get("watermark"))
    test = split_rows(rows)["test"]
    if not test:
        raise ValueError(f"no test records up to id {watermark}")
    # lazy: torch, in the job's child process only (the worker has none)
    from models.training.experiment import evaluate_records

    path = ModelHome(settings.home).version_dir(spec["model_id"], version)
    accuracy = evaluate_records(path, test)["accuracy"]
    return {"version": version, "test_accuracy": accuracy, "test_records": len(test),
            "watermark": watermark}


def watch_cancel(files: AttemptFiles, every_s: float = 0.2) -> None:
    """Exit the process (code 3) as soon as the attempt's cancel flag exists."""

    def watch() -> None:
        while not files.cancelled():
            time.sleep(every_s)
        print("compare: cancel requested; stopping", file=sys.stderr, flush=True)
        os._exit(EXIT_CANCELLED)

    threading.Thread(target=watch, name="cancel-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    started = start_child("cloud_api.jobs.compare", argv, "VERSION")
    if started is None:
        return 2
    files, (version,) = started
    watch_cancel(files)
    progress = ProgressWriter(files)
    progress.state.update(files.read_progress() or {})
    progress.update(force=True, phase=f"comparing with the promoted {version}")
    try:
        job = files.read_job()
        log.info("job %s: measuring the promoted %s on the job's test records",
                 job.get("job_id"), version)
        out = measure(job, version)
    except Exception as exc:  # noqa: BLE001 - every failure is one line for the worker
        write_json_atomically(files.comparison, {"version": version, "error": describe(exc)})
        log.error("compare: %s", describe(exc))
        return EXIT_FAILED
    finally:
        progress.update(force=True, phase="done")
    write_json_atomically(files.comparison, out)
    log.info("compare: %s has test accuracy %.4f on %d records", version,
             out["test_accuracy"], out["test_records"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
