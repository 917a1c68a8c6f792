"""What the benches share: where the repository and the data are, the environment of a child
process, starting and stopping a server, CPU time and percentiles, what machine this is and
how loaded, a table printer.

Every bench is a module of this package, run from the repository root as
``python -m bench.NAME …``; a bench that runs itself (or another bench) in a child process
starts it as ``python -m bench.NAME`` with :func:`repo_env`, so the child imports this
checkout's packages before any installed copy."""

from __future__ import annotations

import csv
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data"


def read_tsv(path: Path, limit: int | None = None) -> list[list[str]]:
    """Rows of a GLUE-style TSV (header skipped)."""
    csv.field_size_limit(sys.maxsize)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(reader)
        rows = []
        for row in reader:
            rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
    return rows


def repo_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) with this checkout first on PYTHONPATH: a child
    started as ``python -m bench.NAME`` (or ``-m cloud_api.cli``) imports this checkout's
    packages, whatever the working directory or an editable install elsewhere."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def module_cmd(module: str, *args: str) -> list[str]:
    """``python -m module args…`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def cli_env(extra: dict) -> dict:
    """The environment of a CLI run by a bench: no PRIVBERT_* from the shell, one thread each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVBERT_")}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PRIVBERT_TORCH_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false", **extra})
    return env


# -- servers ----------------------------------------------------------------------------------
def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cmd: list[str], env: dict, port: int, timeout: float = 300
                 ) -> subprocess.Popen:
    """Start a server in its own session and wait for its /readyz. Its stderr goes to a
    temporary file, not a pipe: nobody reads a pipe during the run, and a server that logs
    more than the pipe holds (64 KiB of tracebacks) would block on its next log line."""
    import httpx

    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log,
                            start_new_session=True)

    def tail() -> str:
        log.seek(0)
        return log.read().decode(errors="replace")[-2000:]

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[:3]} exited {proc.returncode}: {tail()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"{cmd[:3]} not ready after {timeout:.0f} s: {tail()}")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, then SIGKILL to what is left of it (Ray's
    processes outlive its driver)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def serve(home: Path, log: Path, demo: bool = True) -> tuple[subprocess.Popen, str, str]:
    """`cloud-api serve` on a free loopback port for ``home`` (throwaway keys; with ``demo``, the
    /demo page with a demo key), once /readyz answers: (process, URL, application key)."""
    import httpx

    port = free_port()
    key = secrets.token_hex(16)
    env = cli_env({"PRIVBERT_HOME": str(home), "PRIVBERT_API_KEYS": key,
                   "PRIVBERT_ADMIN_KEYS": secrets.token_hex(16),
                   "PRIVBERT_WORKER_IN_SERVE": "0"})
    if demo:
        env.update({"PRIVBERT_DEMO": "1", "PRIVBERT_DEMO_KEY": "demo-" + secrets.token_hex(16)})
    proc = subprocess.Popen([sys.executable, "-m", "cloud_api.cli", "serve", "--port", str(port)],
                            cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"cloud-api serve exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url, key
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("cloud-api serve was not ready in 300 s")


# -- CPU time and statistics ------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def session_cpu(sid: int) -> float:
    """User + system CPU time so far of every process of session ``sid`` (a server started
    with ``start_new_session``: uvicorn's one process, or Ray's driver, GCS, raylet, proxy
    and replica processes), all their threads."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def pct(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile of already sorted values (nearest rank; NaN when empty)."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


# -- the machine ------------------------------------------------------------------------------
def cpu_model() -> str:
    """The processor's model name from /proc/cpuinfo ("unknown CPU" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def load_avg() -> str:
    """The 1, 5 and 15 minute load averages, as ``a/b/c``."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    """One line: CPU count, processor, Python, numpy."""
    import numpy as np

    return (f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}, numpy {np.__version__}")


def table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    sep = "| " + " | ".join("-" * w for w in widths) + " |"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
            for r in cells]
    return "\n".join([line, sep, *body])
