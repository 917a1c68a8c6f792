"""A job's promotion holds the model's promotion lock only for the pointer swap: an admin's
promote during the job's comparison with the promoted version returns at once, and the job
then measures itself against the admin's choice before it may replace it.

The comparison child here is a stand-in script (its accuracies are set by the test, and it
blocks until told) run by the real worker: its own process group, heartbeats on a real
database, the real ``ModelHome`` lock and pointer."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from cloud_api.home import ModelHome
from cloud_api.jobs import publisher, queue
from cloud_api.jobs.attempt import Attempt
from cloud_api.jobs.states import JobKind
from cloud_api.jobs.supervisor import Worker
from cloud_api.settings import Settings
from cloud_api.store.db import Database

COMPARE = '''
import json, pathlib, sys, time
folder, version, accuracies = pathlib.Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
(folder / f"comparing-{version}").write_text("")
while version == "v1" and not (folder / "go").exists():  # v1: blocks until told
    time.sleep(0.05)
(folder / "compare.json").write_text(json.dumps(
    {"version": version, "test_accuracy": accuracies[version], "test_records": 10}))
'''
NEW_ACCURACY = 0.8  # the job's version on its 10 test rows


def _version(home: ModelHome, tmp_path, name: str) -> str:
    src = tmp_path / name
    src.mkdir()
    (src / "config.json").write_text("{}")
    return home.register("m", src)


def _wait(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.mark.parametrize("admins", [0.9, 0.6], ids=["admin-better", "admin-worse"])
def test_an_admin_promote_never_waits_behind_a_comparison_and_the_job_respects_it(
        tmp_path, monkeypatch, admins):
    """v1 is promoted; a job that trained against no version finishes, so its worker
    compares it with v1, and that comparison blocks. An admin promotes v2 meanwhile: it
    returns promptly, though the comparison is still running. The comparison ends (the job
    beats v1), but the pointer no longer names v1: the job compares again with v2 and its
    rule decides. v2 better than the job by more than one standard error: the admin's v2
    stays. v2 worse: the job's version replaces it, and its result says it was measured
    against v2."""
    import json

    home = ModelHome(tmp_path / "home").ensure()
    assert (_version(home, tmp_path, "a"), _version(home, tmp_path, "b")) == ("v1", "v2")
    home.promote("m", "v1")
    script = tmp_path / "compare.py"
    script.write_text(COMPARE)
    accuracies = json.dumps({"v1": 0.5, "v2": admins})
    monkeypatch.setattr(publisher, "compare_command", lambda folder, version: [
        sys.executable, str(script), str(folder), version, accuracies])
    monkeypatch.setattr(publisher, "COMPARE_TIMEOUT_S", 60.0)  # never a half-hour hang
    db = Database(f"sqlite:///{tmp_path / 'jobs.db'}")
    db.upgrade()
    try:
        queue.enqueue(db, JobKind.RETRAIN, {"model_id": "m"})
        settings = Settings(home=home.root, heartbeat_s=0.2,
                            database_url=f"sqlite:///{tmp_path / 'jobs.db'}")
        worker = Worker(settings, db, home, worker_id="w")
        attempt = Attempt(worker, queue.claim(db, "w"))
        attempt.files.prepare({"job_id": attempt.job.id})
        attempt.files.output.mkdir()
        (attempt.files.output / "config.json").write_text("{}")
        result = {"promote": {"requested": True, "decision": True,
                              "reason": "no version was promoted before"},
                  "compared_with": {"version": None, "test_accuracy": None, "error": None},
                  "records": {"test": 10}, "metrics": {"test_accuracy": NEW_ACCURACY}}
        out: list = []
        job = threading.Thread(target=lambda: out.append(worker.publisher.publish(attempt,
                                                                                  result)))
        job.start()
        folder = attempt.files.dir
        try:
            _wait(lambda: (folder / "comparing-v1").exists())
            admin = threading.Thread(target=home.promote, args=("m", "v2"))
            admin.start()
            admin.join(5.0)
            assert not admin.is_alive(), "the admin's promote waited behind the comparison"
            assert home.promoted("m") == "v2" and job.is_alive()
            assert not (folder / "compare.json").exists()  # the comparison is still running
        finally:
            (folder / "go").write_text("")
            job.join(60)
        res = out[0]
    finally:
        db.dispose()
    assert (folder / "comparing-v2").exists()  # compared again, with the admin's choice
    assert res["version"] == "v3" and home.versions("m") == ["v1", "v2", "v3"]
    was = res["compared_with"]
    assert was["version"] == "v2" and was["test_accuracy"] == admins and was["error"] is None
    assert was["at_training"]["version"] is None
    assert "the promoted version changed while the job ran (none -> v2" in res["promotion"]
    figures = f"test accuracy {NEW_ACCURACY:.4f} against {admins:.4f} of v2 on the same 10"
    assert figures in res["promotion"], res["promotion"]
    if admins > NEW_ACCURACY:
        assert not res["promoted"] and home.promoted("m") == "v2"
        assert res["promotion"].startswith("not promoted: ")
    else:
        assert res["promoted"] and home.promoted("m") == "v3"


def test_a_pointer_that_keeps_moving_stops_the_job_from_promoting(tmp_path, monkeypatch):
    """Every comparison ends with the pointer moved again (an admin promoting back and
    forth): after MAX_COMPARISONS the job registers its version, does not promote, and
    says why; the admin's last choice stays."""
    import json

    home = ModelHome(tmp_path / "home").ensure()
    assert (_version(home, tmp_path, "a"), _version(home, tmp_path, "b")) == ("v1", "v2")
    home.promote("m", "v1")
    script = tmp_path / "flip.py"
    script.write_text(
        "import json, pathlib, sys\n"
        "from cloud_api.home import ModelHome\n"
        "folder, version = pathlib.Path(sys.argv[1]), sys.argv[2]\n"
        "ModelHome(sys.argv[3]).promote('m', 'v2' if version == 'v1' else 'v1')  # an admin\n"
        "(folder / 'compare.json').write_text(json.dumps(\n"
        "    {'version': version, 'test_accuracy': 0.1, 'test_records': 10}))\n")
    monkeypatch.setattr(publisher, "compare_command", lambda folder, version: [
        sys.executable, str(script), str(folder), version, str(home.root)])
    monkeypatch.setattr(publisher, "COMPARE_TIMEOUT_S", 60.0)  # never a half-hour hang
    db = Database(f"sqlite:///{tmp_path / 'jobs.db'}")
    db.upgrade()
    try:
        queue.enqueue(db, JobKind.RETRAIN, {"model_id": "m"})
        worker = Worker(Settings(home=home.root, heartbeat_s=0.2), db, home, worker_id="w")
        attempt = Attempt(worker, queue.claim(db, "w"))
        attempt.files.prepare({"job_id": attempt.job.id})
        attempt.files.output.mkdir()
        (attempt.files.output / "config.json").write_text(json.dumps({}))
        res = worker.publisher.publish(attempt, {
            "promote": {"requested": True, "decision": True, "reason": "no version before"},
            "compared_with": {"version": None, "test_accuracy": None, "error": None},
            "records": {"test": 10}, "metrics": {"test_accuracy": 0.9}})
    finally:
        db.dispose()
    n = publisher.MAX_COMPARISONS
    assert not res["promoted"] and res["version"] == "v3"
    last = "v1" if n % 2 == 1 else "v2"  # compared with v1, v2, v1, ...
    now = "v2" if last == "v1" else "v1"
    assert res["promotion"] == (
        f"not promoted: the promoted version kept changing while the job compared with it "
        f"({n} comparisons, the last with {last}, now {now}); promote by hand if wanted")
    assert home.promoted("m") == now and res["compared_with"]["version"] == last
