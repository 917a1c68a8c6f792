"""The worker with real child processes on a tiny BERT: a pretraining job registers a base
that a retraining job starts from, registering and promoting a version; a killed child is
retried and a cancel registers nothing; a failing child fails the job with its reason; a
2-process gloo torchrun job (on PostgreSQL) produces a version."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from cloud_api.home import ModelHome
from cloud_api.jobs import queue
from cloud_api.jobs.requests import PretrainRequest, RetrainRequest
from cloud_api.jobs.specs import check_pretrain, check_retrain
from cloud_api.jobs.supervisor import Worker
from cloud_api.serving.bundles import BundleStore
from tests.cloud_api.jobs.conftest import ETA


def submit(env, **kw) -> int:
    db, home = env.database(), ModelHome(env.home)
    req = RetrainRequest(**{"task": env.task, "model_id": "m", "base": "tiny", "epochs": 2,
                            "lr": 1e-3, "batch_size": 8, **kw})
    spec = check_retrain(db, home, BundleStore(home), env.settings(), req)
    return queue.enqueue(db, "retrain", spec, max_attempts=2)


def wait_for(predicate, timeout: float = 90.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not met in time")


def children_of(attempt_dir: Path) -> list[int]:
    """Pids of processes whose command line names ``attempt_dir``."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(attempt_dir).encode() in cmd:
                pids.append(int(p.name))
    return pids


def test_the_output_of_a_job_reaped_meanwhile_is_not_registered(db, tmp_path):
    """The child finished while the reaper gave its job to another worker (late heartbeats,
    the database away): registering its output too would add a second version, here
    promoted."""
    from cloud_api.jobs.attempt import Attempt
    from cloud_api.jobs.files import AttemptFiles
    from cloud_api.jobs.states import AttemptEnd, ChildExit
    from cloud_api.settings import Settings

    home = ModelHome(tmp_path / "home").ensure()
    job_id = queue.enqueue(db, "retrain", {"task": "t", "model_id": "m"})
    job = queue.claim(db, "w1")
    files = AttemptFiles(home.job_dir(job_id) / "attempt-1")
    files.prepare({"job_id": job_id})
    files.output.mkdir()
    (files.output / "config.json").write_text("{}")
    files.write_result({"promote": {"decision": True, "reason": "no version was promoted"},
                        "compared_with": {"version": None}})
    assert queue.reap(db, timeout_s=0) == [(job_id, "queued")]
    assert queue.claim(db, "w2").attempts == 2
    worker = Worker(Settings(home=home.root), db, home, worker_id="w1")
    assert Attempt(worker, job).conclude(0, ChildExit.EXITED) == AttemptEnd.LOST
    assert home.versions("m") == [] and home.promoted("m") is None
    assert not files.output.exists()
    assert queue.get(db, job_id).worker_id == "w2"


def test_children_import_this_repository_and_never_see_the_keys(tmp_path, monkeypatch):
    """The child's environment puts the repository first on its path (the worker's own
    code, wherever the package moved) and leaves out every key variable."""
    from cloud_api.jobs.children import child_env
    from cloud_api.settings import Settings

    monkeypatch.setenv("PRIVBERT_API_KEYS", "secret-key")
    home = ModelHome(tmp_path / "home").ensure()
    env = child_env(Settings(home=home.root), home.root)
    repo = Path(__file__).resolve().parents[3]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(repo)
    assert "PRIVBERT_API_KEYS" not in env and env["PRIVBERT_HOME"] == str(home.root.resolve())


def test_a_killed_child_is_retried_and_a_cancel_registers_nothing(job_env):
    db, home = job_env.database(), ModelHome(job_env.home)
    job_id = submit(job_env, epochs=100, promote=True)
    step = lambda: (queue.get(db, job_id).progress or {}).get("step") or 0  # noqa: E731
    # attempt 1: the child is SIGKILLed (what the out-of-memory killer does) -> queued again
    worker = Worker(job_env.settings(), db, home)
    done: list = []
    t = threading.Thread(target=lambda: done.append(worker.run(once=True)))
    t.start()
    try:
        wait_for(lambda: step() > 1)
        for pid in children_of(home.job_dir(job_id) / "attempt-1"):
            os.kill(pid, signal.SIGKILL)
        t.join(60)
    finally:
        worker.stop(30)
    assert done == ["queued"]
    job = queue.get(db, job_id)
    assert job.state == "queued" and job.attempts == 1 and "killed by SIGKILL" in job.error
    # attempt 2: cancelled mid-training -> stops at the next step, no version
    worker = Worker(job_env.settings(), db, home)
    done.clear()
    t = threading.Thread(target=lambda: done.append(worker.run(once=True)))
    t.start()
    try:
        wait_for(lambda: queue.get(db, job_id).attempts == 2 and step() > 2)
        assert queue.request_cancel(db, job_id).cancel_requested
        t.join(60)
    finally:
        worker.stop(30)
    assert done == ["cancelled"]
    job = queue.get(db, job_id)
    assert job.state == "cancelled" and "no version registered" in job.error
    assert home.versions("m") == [] and home.promoted("m") is None
    assert job.progress["step"] < job.progress["total"]  # it stopped early
    assert children_of(home.job_dir(job_id) / "attempt-2") == []


def test_a_failing_child_fails_the_job_with_its_reason(job_env):
    from cloud_api.store.records import delete_records

    db, home = job_env.database(), ModelHome(job_env.home)
    job_id = submit(job_env)
    # every record is erased between submission and training: the child's error is the reason
    assert delete_records(db, task=job_env.task) == 96
    assert Worker(job_env.settings(), db, home).run(once=True) == "failed"
    job = queue.get(db, job_id)
    assert job.state == "failed" and job.attempts == 1
    assert job.error.startswith("ValueError: task sent has no training records up to id 0")
    assert "Traceback" not in job.error and "ValueError" in job.log_tail
    assert home.versions("m") == []


def test_torchrun_two_process_gloo_job_on_postgresql_produces_a_version(pg_job_env):
    job_env = pg_job_env  # the children read their snapshot from PostgreSQL
    db, home = job_env.database(), ModelHome(job_env.home)
    job_id = submit(job_env, epochs=2)
    worker = Worker(job_env.settings(), db, home, torchrun_nproc=2)
    assert worker.run(once=True) == "succeeded", queue.get(db, job_id).log_tail
    job = queue.get(db, job_id)
    assert job.result["metrics"]["world_size"] == 2 and job.result["version"] == "v1"
    assert job.watermark == job.result["watermark"] and sum(job.result["records"].values()) == 96
    assert "DDP 2 processes (gloo)" in job.log_tail
    from models.versions.model_version import load_model

    assert load_model(home.version_dir("m", "v1")).labels == ["neg", "pos"]


def test_pretrain_job_registers_a_base_that_retraining_can_start_from(job_env, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(job_env.texts) + "\n")
    settings = job_env.settings(pretrain_corpus=corpus)
    db, home = job_env.database(), ModelHome(job_env.home)
    req = PretrainRequest(objective="denoising", mechanism="dchi-text", params={"eta": ETA},
                          steps=6, name="pre", base="tiny", batch_size=8, max_length=32)
    job_id = queue.enqueue(db, "pretrain", check_pretrain(db, home, settings, req))
    assert Worker(settings, db, home).run(once=True) == "succeeded"
    job = queue.get(db, job_id)
    assert job.result["base"] == "pre" and job.result["metrics"]["steps"] == 6
    info = json.loads((home.base_dir("pre") / "pretrain.json").read_text())
    assert info["bundle_id"] == job_env.bundle.bundle_id and info["mechanism"] == "dchi-text"
    assert not (home.base_dir("pre") / "checkpoints").exists()
    assert job.progress["step"] == 6
    with pytest.raises(Exception, match="exists already"):
        check_pretrain(db, home, settings, req)
    # a retraining job starts from the new base: a version registered, promoted, and its
    # data.json names the watermark and the counts
    retrain = submit(job_env, base="pre", epochs=2, promote=True)
    assert Worker(settings, db, home).run(once=True) == "succeeded"
    job = queue.get(db, retrain)
    assert job.state == "succeeded" and job.attempts == 1 and job.error is None
    cfg = json.loads((home.version_dir("m", "v1") / "config.json").read_text())
    assert cfg["base_model"] == str(home.base_dir("pre")) and cfg["pretraining"]["matches"]
    res = job.result
    assert res["version"] == "v1" and res["promoted"] and home.promoted("m") == "v1"
    assert res["promotion"] == "no version was promoted before"
    counts = res["records"]
    assert sum(counts.values()) == 96 and min(counts.values()) > 0
    data = json.loads((home.version_dir("m", "v1") / "data.json").read_text())
    assert data["watermark"] == job.watermark == res["watermark"] == 96
    assert data["records"] == counts and data["train_examples"] == counts["train"]
    assert data["task"] == job_env.task and data["job_id"] == retrain
    assert 0.0 <= res["metrics"]["test_accuracy"] <= 1.0
    assert job.progress["phase"] == "done"
    assert job.progress["step"] == job.progress["total"] == math.ceil(counts["train"] / 8) * 2
    assert "done" in job.log_tail
    # nothing of the raw sentences in the job folders or the new version
    folders = [home.job_dir(job_id), home.job_dir(retrain), home.version_dir("m", "v1")]
    blobs = b"".join(f.read_bytes() for d in folders for f in d.rglob("*") if f.is_file())
    assert not any(t.encode() in blobs for t in job_env.texts if len(t) > 12)
    assert not (home.job_dir(retrain) / "attempt-1" / "output").exists()
