"""The child processes of a job, as the worker starts and ends them: command lines,
environment (the repository first on the path, no key variables), signals to a process
group, and the one-line reason a child failed. The supervision loop is ``supervisor.py``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from cloud_api.jobs.run import PARENT_ENV
from cloud_api.settings import Settings

KILL_GRACE_S = 5.0      # after SIGTERM, before SIGKILL
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # the repository (children import from it)
SECRET_ENV = ("PRIVBERT_API_KEYS", "PRIVBERT_ADMIN_KEYS", "PRIVBERT_KEYS_FILE",
              "PRIVBERT_TEXTHIDE_KEY")


def child_command(attempt_dir: Path, nproc: int = 0, torchrun_args: str = "") -> list[str]:
    """The child's command line: one process, or ``torchrun`` with ``nproc`` per node
    (``--standalone`` unless rendezvous flags are given in ``torchrun_args``)."""
    run = ["-m", "cloud_api.jobs.run", str(attempt_dir)]
    if nproc <= 0:
        return [sys.executable, *run]
    extra = shlex.split(torchrun_args) or ["--standalone"]
    return [sys.executable, "-m", "cloud_api.jobs.launch", str(attempt_dir),  # torchrun that
            "--nproc-per-node", str(nproc), *extra, *run]          # records killed ranks


def compare_command(attempt_dir: Path, version: str) -> list[str]:
    """The comparison child's command line (one process): VERSION on the job's test rows."""
    return [sys.executable, "-m", "cloud_api.jobs.compare", str(attempt_dir), version]


def child_env(settings: Settings, home_root: str | os.PathLike) -> dict[str, str]:
    """This process's environment less the key variables, plus what the child reads."""
    s = settings
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    env.update({"PRIVBERT_HOME": str(Path(home_root).resolve()),
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


def signal_group(pid: int, sig: int) -> None:
    """``sig`` to the process group ``pid`` leads (each child starts its own session)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill(child: subprocess.Popen) -> None:
    """SIGTERM to the child's group, SIGKILL after :data:`KILL_GRACE_S`; waits for it."""
    signal_group(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        signal_group(child.pid, signal.SIGKILL)
        child.wait()


def exit_reason(rc: int, what: str = "training") -> str:
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else -rc
        hint = " (out of memory?)" if rc == -signal.SIGKILL else ""
        return f"the {what} process was killed by {name}{hint}"
    return f"the {what} process exited with code {rc}"


def rank_reason(killed: dict, error: str | None) -> str:
    """Why a torchrun child failed when a signal killed one of its ranks (the other ranks'
    errors, e.g. a lost connection to it, are consequences)."""
    hint = " (out of memory?)" if killed.get("signal") == "SIGKILL" else ""
    then = f"; then: {error}" if error else ""
    return (f"torchrun rank {killed.get('rank')} was killed by "
            f"{killed.get('signal') or killed.get('exitcode')}{hint}{then}")[:1000]
