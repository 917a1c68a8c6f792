"""The folder of one job attempt: how the worker and its child process talk.

    $PRIVBERT_HOME/jobs/<job_id>/attempt-<n>/
      job.json        what to do (written by the worker): id, kind, spec, watermark, attempt
      log.txt         the child's stdout and stderr (no payload data, no keys)
      progress.json   the child's progress, replaced atomically (step, total, loss, ...)
      cancel          present = stop at the next step (created by the worker)
      result.json     the child's result when it succeeded (rank 0)
      error.txt       one line: why the child failed
      ranks.json      under torchrun: the ranks that failed, exit code or signal (launch.py)
      compare.json    the comparison child's accuracy of the promoted version (compare.py)
      output/         the model version or pretrained base the child wrote

Plain files on the shared ``$PRIVBERT_HOME``, no database and no torch: the worker reads
progress for its heartbeats, the child polls the cancel flag every training step.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from cloud_api.home import write_atomically

EXIT_CANCELLED = 3  # the child's exit code when it stopped on the cancel flag
LOG_TAIL_LINES = 40


def write_json_atomically(path: Path, obj: Any) -> None:
    write_atomically(path, json.dumps(obj, indent=1, sort_keys=True, default=str),
                     durable=False)


class AttemptFiles:
    """Paths and small readers/writers of one attempt's folder."""

    def __init__(self, folder: str | os.PathLike):
        self.dir = Path(folder)

    job = property(lambda self: self.dir / "job.json")
    log = property(lambda self: self.dir / "log.txt")
    progress = property(lambda self: self.dir / "progress.json")
    cancel_flag = property(lambda self: self.dir / "cancel")
    result = property(lambda self: self.dir / "result.json")
    error = property(lambda self: self.dir / "error.txt")
    output = property(lambda self: self.dir / "output")
    ranks = property(lambda self: self.dir / "ranks.json")
    comparison = property(lambda self: self.dir / "compare.json")

    # -- worker side ------------------------------------------------------------------------
    def prepare(self, job: dict) -> None:
        """A fresh folder with ``job.json`` (an earlier folder of this attempt is removed:
        its owner released it)."""
        import shutil

        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        write_json_atomically(self.job, job)

    def request_cancel(self) -> None:
        self.cancel_flag.touch()

    def read_progress(self) -> dict | None:
        return _read_json(self.progress)

    def read_result(self) -> dict | None:
        return _read_json(self.result)

    def read_comparison(self) -> dict | None:
        return _read_json(self.comparison)

    def read_error(self) -> str | None:
        try:
            text = self.error.read_text().strip()
        except FileNotFoundError:
            return None
        return text or None

    def killed_rank(self) -> dict | None:
        """Under torchrun: the first rank (by rank) that a signal other than SIGTERM killed,
        from ``ranks.json`` (``{"rank", "exitcode", "signal", ...}``); None if none was.
        SIGTERM is left out: torchrun itself stops the surviving ranks with it once one rank
        has failed, so a rank that raised leaves the others "killed by SIGTERM"."""
        try:
            failures = json.loads(self.ranks.read_text())["failures"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
            return None
        killed = [f for f in failures if isinstance(f, dict) and
                  isinstance(f.get("exitcode"), int) and f["exitcode"] < 0 and
                  f["exitcode"] != -signal.SIGTERM]
        return min(killed, key=lambda f: f.get("rank", 0), default=None)

    def log_tail(self, lines: int = LOG_TAIL_LINES, max_bytes: int = 16384) -> str:
        """The last ``lines`` lines of the log (progress-bar carriage returns folded)."""
        try:
            with open(self.log, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - max_bytes))
                data = fh.read()
        except FileNotFoundError:
            return ""
        text = data.decode("utf-8", "replace").replace("\r\n", "\n")
        out = [ln.rsplit("\r", 1)[-1] for ln in text.split("\n")]
        if size > max_bytes:
            out = out[1:]  # the first line was cut
        return "\n".join(out[-lines - 1:]).strip("\n")

    # -- child side -------------------------------------------------------------------------
    def read_job(self) -> dict:
        return json.loads(self.job.read_text())

    def cancelled(self) -> bool:
        return self.cancel_flag.exists()

    def write_result(self, result: dict) -> None:
        write_json_atomically(self.result, result)

    def write_error(self, message: str) -> None:
        """The first error wins (under torchrun every rank may fail)."""
        try:
            fd = os.open(self.error, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        with os.fdopen(fd, "w") as fh:
            fh.write(message.strip().replace("\n", " ")[:2000] + "\n")


    def write_rank_failures(self, failures: list[dict]) -> None:
        """The launcher's record of torchrun's failed ranks (see :meth:`killed_rank`)."""
        write_json_atomically(self.ranks, {"failures": failures})


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class ProgressWriter:
    """The child's progress file, rewritten at most every ``min_interval_s`` (and always
    when ``force``), so a fast training loop does not spend its time writing JSON."""

    def __init__(self, files: AttemptFiles, enabled: bool = True, min_interval_s: float = 0.5):
        self.files, self.enabled, self.min_interval_s = files, enabled, min_interval_s
        self.state: dict[str, Any] = {}
        self._last = 0.0

    def update(self, force: bool = False, **values: Any) -> None:
        self.state.update(values)
        now = time.monotonic()
        if self.enabled and (force or now - self._last >= self.min_interval_s):
            self._last = now
            write_json_atomically(self.files.progress, self.state)
