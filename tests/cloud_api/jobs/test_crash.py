"""A ``cloud-api worker`` process killed with SIGKILL in the middle of training: the job
leaves ``running`` within heartbeat timeout + one reaper interval (another worker's
reaper), is retried and succeeds; every record is still there; the orphaned training
process exits; predictions are answered all along (real ``cloud-api serve`` without its
worker thread, two real ``cloud-api worker`` processes)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from cloud_api.home import ModelHome, version_number
from tests.cloud_api.conftest import ETA, REPO, cli_env, payloads_for
from tests.cloud_api.jobs.conftest import sentences, serve_jobs
from tests.cloud_api.jobs.test_http_jobs import admin, declare, post_records, wait_job
from tests.cloud_api.jobs.test_worker import children_of, wait_for

HEARTBEAT_TIMEOUT_S, REAPER_INTERVAL_S = 3.0, 0.5


@pytest.fixture(scope="module")
def crash_server(tiny_home, tmp_path_factory):
    with serve_jobs(tiny_home, tmp_path_factory, "jobs-crash", {
            "PRIVBERT_WORKER_IN_SERVE": "0",
            "PRIVBERT_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
            "PRIVBERT_REAPER_INTERVAL_S": str(REAPER_INTERVAL_S),
            "PRIVBERT_MAX_ATTEMPTS": "2"}) as server:
        yield server


def start_worker(server, name: str) -> subprocess.Popen:
    log = open(server.root / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([sys.executable, "-m", "cloud_api.cli", "worker",
                             "--worker-id", f"{name}:{os.getpid()}"], cwd=REPO,
                            env=cli_env(server.env), stdout=log, stderr=subprocess.STDOUT)
    proc.log_file = log
    return proc


def stop_worker(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    proc.log_file.close()


def task_records(server, task: str) -> int:
    tasks = admin(server, "GET", "/admin/tasks").json()["tasks"]
    return next(t["records"] for t in tasks if t["task"] == task)


def test_sigkilled_worker_job_is_reaped_retried_and_succeeds(crash_server, tiny_bundle_of_home):
    server = crash_server
    declare(server, "crash", tiny_bundle_of_home.bundle_id, eta=ETA)  # what model text reads
    texts, labels = sentences(64, seed=21)
    ids = post_records(server, "crash", tiny_bundle_of_home, texts, labels, eta=ETA)
    assert task_records(server, "crash") == len(ids) == 64

    # the served home is a copy of the shared tiny home, which other test files (in this
    # process, under xdist in any order) may have given more versions: the job's version is
    # the next one, compared with the one promoted now
    home = ModelHome(server.home)
    promoted_before = home.promoted("text")
    next_version = f"v{max(version_number(v) for v in home.versions('text')) + 1}"
    workers = {name: start_worker(server, name) for name in ("worker-a", "worker-b")}
    stop_predicting = threading.Event()
    statuses: list[int] = []
    try:
        for name in workers:  # both polling before the job exists: either may claim it
            wait_for(lambda n=name: b"started" in (server.root / f"{n}.log").read_bytes(),
                     timeout=60)
        r = admin(server, "POST", "/admin/retrain", json={
            "task": "crash", "model_id": "text", "base": "tiny", "epochs": 60, "lr": 1e-3,
            "batch_size": 8, "promote": True})
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]

        def job() -> dict:
            return admin(server, "GET", f"/admin/jobs/{job_id}").json()

        first = wait_for(lambda: (j := job())["state"] == "running"
                         and (j["progress"] or {}).get("step", 0) > 1 and j, timeout=120)
        victim = first["worker_id"].split(":")[0]
        survivor = next(n for n in workers if n != victim)
        attempt1 = server.home / "jobs" / str(job_id) / "attempt-1"
        assert children_of(attempt1), "the training process should be running"

        payloads = payloads_for(server.model("text"), ["a good film", "dull plot"],
                                tiny_bundle_of_home)
        body = {"payloads": [p.model_dump(mode="json", exclude_none=True) for p in payloads]}

        def predict() -> None:
            with httpx.Client(base_url=server.url, headers=server.headers(), timeout=30) as c:
                while not stop_predicting.is_set():
                    statuses.append(c.post("/v1/models/text/predict", json=body).status_code)
                    time.sleep(0.05)

        predictor = threading.Thread(target=predict)
        predictor.start()
        workers[victim].kill()  # SIGKILL: no cleanup, no goodbye
        killed_at = time.monotonic()
        wait_for(lambda: job()["attempts"] == 2 or job()["state"] != "running", timeout=30,
                 every=0.05)
        left_after = time.monotonic() - killed_at
        # stale after the timeout, noticed at the survivor's next reap (plus polling)
        assert left_after <= HEARTBEAT_TIMEOUT_S + REAPER_INTERVAL_S + 1.5, left_after
        # the orphaned training process noticed its worker is gone and exited
        wait_for(lambda: not children_of(attempt1), timeout=15)
        assert "is gone; stopping" in (attempt1 / "log.txt").read_text()
        assert not (attempt1 / "result.json").exists()

        final = wait_job(server, job_id)
        stop_predicting.set()
        predictor.join(30)
    finally:
        stop_predicting.set()
        for proc in workers.values():
            stop_worker(proc)
    assert final["state"] == "succeeded", final
    assert final["attempts"] == 2 and final["worker_id"] == f"{survivor}:{os.getpid()}"
    assert task_records(server, "crash") == 64  # no record lost
    assert len(statuses) >= 5 and set(statuses) == {200}
    res = final["result"]
    assert res["version"] == next_version and res["compared_with"]["version"] == promoted_before
    new, cur, n = (res["metrics"]["test_accuracy"], res["compared_with"]["test_accuracy"],
                   res["records"]["test"])
    assert res["promoted"] == (new >= cur - math.sqrt(cur * (1 - cur) / n) - 1e-12)
    reaped = (server.root / f"{survivor}.log").read_text()
    assert f"reaper: job {job_id} had no heartbeat" in reaped
