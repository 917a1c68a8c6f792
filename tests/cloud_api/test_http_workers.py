"""`cloud-api serve --workers N`: /metrics shows the whole server whichever worker answers.

A real `cloud-api serve --workers 2` (onnx backend, a private home with the session's
``text`` v1) on a loopback port: authenticated GETs over fresh connections until both
workers have answered some; every scrape, over a fresh connection, then shows the total sent,
whichever worker answered it. Which worker served what is read from the per-process files
of prometheus-client's multiprocess directory (the per-process view: one file per worker),
never from a label of the exposition. A worker stopped on its own (SIGTTOU to the parent)
leaves the live gauges and keeps its counters; the directory is private and is gone once
the server stops. The directory's lifecycle, the sweep of killed workers' gauges and the
unloaded series are checked without a server, in subprocesses.
"""

from __future__ import annotations

import glob
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.cloud_api.conftest import ServerProcess, cli_env, new_keys, onnx_home
from tests.conftest import REPO

ROUTE = "/v1/models"
MAX_REQUESTS = 400  # sent in rounds until both workers answered some


def _samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name]


def _value(text: str, name: str, **labels: str) -> float | None:
    found = [s for s in _samples(text, name)
             if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, found  # one series per label set: no per-worker (pid) series
    return found[0].value if found else None


def _per_worker(path: Path, route: str) -> dict[int, float]:
    """pid -> privbert_request_total of ``route`` in that worker's own counter file."""
    out = {}
    for file in glob.glob(str(path / "counter_*.db")):
        pid = int(Path(file).stem.split("_")[1])
        out[pid] = sum(s.value for m in MultiProcessCollector.merge([file])
                       for s in m.samples
                       if s.name == "privbert_request_total" and s.labels["route"] == route)
    return out


def _counted(path: Path, route: str, total: int, timeout: float = 10.0) -> dict[int, float]:
    """The per-worker counts once they add up to ``total`` (a request is counted just after
    its answer is sent)."""
    deadline = time.monotonic() + timeout
    while True:
        per = _per_worker(path, route)
        if sum(per.values()) >= total or time.monotonic() > deadline:
            return per
        time.sleep(0.02)


def _live_gauge_pids(path: Path) -> set[int]:
    """The pids with a file of live gauges."""
    return {int(Path(f).stem.rsplit("_", 1)[1])
            for f in glob.glob(str(path / "gauge_live*_*.db"))}


def _ready_twice(srv: ServerProcess, path: Path) -> bool:
    """One more /readyz; True once two workers have answered it."""
    assert httpx.get(f"{srv.url}/readyz", timeout=10).status_code == 200
    return len([n for n in _per_worker(path, "/readyz").values() if n > 0]) == 2


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_workers_one_metrics_view(tiny_home, tmp_path):
    home, _ = onnx_home(tiny_home, tmp_path / "home")
    tmp = tmp_path / "tmp"  # the parent's tempfile.mkdtemp goes here
    tmp.mkdir()
    srv = ServerProcess(home.root, tmp_path / "serve.log", new_keys(), serve_args=(
        "--workers", "2"), env={"TMPDIR": str(tmp), "PRIVBERT_BACKEND": "onnx",
                                "PRIVBERT_WORKER_IN_SERVE": "0",
                                "PRIVBERT_RATE_LIMIT_PER_KEY": "0"})
    srv.start()
    try:
        [path] = [Path(p) for p in glob.glob(str(tmp / "privbert-metrics-*"))]
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        # both workers ready (a worker accepts connections once its models are loaded)
        _wait(lambda: _ready_twice(srv, path), 120, "both workers answering /readyz")

        sent = 0
        while sent < MAX_REQUESTS:
            for _ in range(20):  # httpx.get: a new connection each time
                r = httpx.get(f"{srv.url}{ROUTE}", headers=srv.headers(), timeout=10)
                assert r.status_code == 200, r.text
                sent += 1
            per = _counted(path, ROUTE, sent)
            if len(per) == 2 and min(per.values()) > 0:
                break
        assert sum(per.values()) == sent, per
        assert len(per) == 2 and min(per.values()) > 0, f"one worker served all: {per}"

        # every scrape shows the whole server, whichever worker answers it
        answered: dict[int, int] = {}  # pid -> scrapes it answered
        for _ in range(200):
            before = _per_worker(path, "/metrics")
            text = httpx.get(f"{srv.url}/metrics", timeout=10).text
            assert _value(text, "privbert_request_total", route=ROUTE, method="GET",
                          status="200") == sent
            assert _value(text, "privbert_model_loaded", model="text", version="v1") == 1
            # this scrape, and maybe the previous one: a worker counts a request out just
            # after its answer is sent, which the next scrape (to the other worker) can beat
            assert _value(text, "privbert_requests_in_flight") in (1, 2)
            after = _counted(path, "/metrics", sum(before.values()) + 1)
            grew = [p for p in after if after[p] > before.get(p, 0)]
            assert len(grew) == 1, (before, after)
            answered[grew[0]] = answered.get(grew[0], 0) + 1
            if len(answered) == 2:
                break
        assert len(answered) == 2, f"every scrape went to one worker: {answered}"
        _wait(lambda: _in_flight(srv) == 1, 10, "in flight: only the scrape itself")

        # one worker stops on its own (uvicorn: SIGTTOU = one worker fewer): at its exit
        # its live gauges leave the directory (before any scrape could sweep them), its
        # counters stay in the sums
        workers = _live_gauge_pids(path)
        srv.proc.send_signal(signal.SIGTTOU)
        [gone] = _wait(lambda: workers - _live_gauge_pids(path), 60, "a worker's exit")
        assert (path / f"counter_{gone}.db").is_file()
        _wait(lambda: not _pid_alive(gone), 30, "the stopped worker's end")
        for _ in range(3):
            text = httpx.get(f"{srv.url}/metrics", timeout=10).text
            assert _value(text, "privbert_request_total", route=ROUTE, method="GET",
                          status="200") == sent
            assert _value(text, "privbert_model_loaded", model="text", version="v1") == 1
        _wait(lambda: _in_flight(srv) == 1, 10, "in flight: only the scrape itself")
    finally:
        code = srv.stop()
    assert code == 0, srv.log_tail()
    assert not glob.glob(str(tmp / "privbert-metrics-*")), "the metrics directory is left"
    lines = srv.log_lines()  # every line JSON, no key in any
    assert lines and not any(k in srv.log.read_text() for k in srv.keys["app"])
    assert "Traceback" not in srv.log.read_text(), srv.log_tail()


def _in_flight(srv) -> float:
    return _value(httpx.get(f"{srv.url}/metrics", timeout=10).text,
                  "privbert_requests_in_flight")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _python(code: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=cli_env(env),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_scrape_sums_live_workers_and_forgets_killed_ones(tmp_path):
    """A worker killed without its exit hook (os._exit, as SIGKILL) leaves its gauges in its
    file: the scrape drops them since its pid is gone; its counters stay. An unloaded
    version's 1 cannot be removed from a file: it becomes 0."""
    from cloud_api import metrics

    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    killed = _python(
        "import os\nfrom cloud_api import metrics as m\n"
        "m.IN_FLIGHT.inc(3); m.QUEUE_SIZE.labels('text', 'v0').set(5)\n"
        "m.LOADED.labels('text', 'v0').set(1)\n"
        "m.REQUESTS.labels('/v1/models', 'GET', '200').inc(7)\nos._exit(0)\n", env)
    assert killed.wait(60) == 0, killed.stderr.read()
    live = _python(
        "import sys\nfrom cloud_api import metrics as m\n"
        "m.IN_FLIGHT.inc(2); m.QUEUE_SIZE.labels('text', 'v1').set(4)\n"
        "m.LOADED.labels('text', 'v1').set(1); m.LOADED.labels('text', 'v2').set(1)\n"
        "m.drop_series(m.LOADED, 'text', 'v2')\n"
        "m.REQUESTS.labels('/v1/models', 'GET', '200').inc(5)\n"
        "print('ready', flush=True)\nsys.stdin.read()\n", env, stdin=subprocess.PIPE)
    try:
        assert live.stdout.readline().strip() == "ready", live.stderr.read()
        assert killed.pid in _live_gauge_pids(tmp_path)
        text = metrics.exposition(str(tmp_path)).decode()
        assert killed.pid not in _live_gauge_pids(tmp_path)
        assert live.pid in _live_gauge_pids(tmp_path)
    finally:
        live.communicate("", timeout=60)
    assert _value(text, "privbert_request_total", route="/v1/models") == 12
    assert _value(text, "privbert_requests_in_flight") == 2
    assert _value(text, "privbert_queue_size", model="text", version="v1") == 4
    assert _value(text, "privbert_queue_size", model="text", version="v0") is None
    assert _value(text, "privbert_model_loaded", model="text", version="v0") is None
    assert _value(text, "privbert_model_loaded", model="text", version="v1") == 1
    assert _value(text, "privbert_model_loaded", model="text", version="v2") == 0


@pytest.mark.parametrize("inherited", ["PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"])
def test_multiprocess_directory_only_for_several_workers(tmp_path, monkeypatch, inherited):
    from cloud_api.cli import multiprocess_metrics

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    monkeypatch.setenv(inherited, "/somewhere/else")
    with multiprocess_metrics(1) as path:  # one process: no directory, no variable
        assert path is None
        assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
        assert "prometheus_multiproc_dir" not in os.environ
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(inherited, "/somewhere/else")
    with multiprocess_metrics(3) as path:
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == path
        assert "prometheus_multiproc_dir" not in os.environ
        assert Path(path).parent == tmp_path and list(Path(path).iterdir()) == []
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
        (Path(path) / "counter_1.db").write_bytes(b"x")
    assert list(tmp_path.iterdir()) == []
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def test_one_process_serves_the_default_registry():
    """Without the variable /metrics is the default registry, as before (its process
    collector, which multiprocess mode does not have, is there)."""
    from cloud_api import metrics

    assert metrics.multiprocess_dir() is None
    text = metrics.exposition().decode()
    assert _samples(text, "process_cpu_seconds_total")
    assert "privbert_requests_in_flight" in text
