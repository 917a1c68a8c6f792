"""Helpers for the benchmarks: where the data is, what machine this is, a table printer."""

from __future__ import annotations

import csv
import os
import platform
import secrets
import subprocess
import sys
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


def cli_env(extra: dict) -> dict:
    """The environment of a CLI run by a bench: no PRIVBERT_* from the shell, one thread each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVBERT_")}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PRIVBERT_TORCH_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false", **extra})
    return env


def serve(home: Path, log: Path, demo: bool = True) -> tuple[subprocess.Popen, str, str]:
    """`cloud-api serve` on a free loopback port for ``home`` (throwaway keys; with ``demo``, the
    /demo page with a demo key), once /readyz answers: (process, URL, application key)."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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


def machine() -> str:
    """One line: CPU count, processor, Python, numpy."""
    import numpy as np

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.machine()}, "
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
