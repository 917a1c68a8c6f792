"""Races of the job queue: two pretraining requests for one base name
(one job and one 409, on SQLite and PostgreSQL), two retraining jobs promoting the same
model at once (one promotes; the other finds the pointer moved when it holds the promotion
lock, is compared again with the version the first promoted, and promoted or not by the
job's rule; a comparison that
cannot be made promotes nothing and says why), and a torchrun rank killed by a signal
(retried like a single process killed by one)."""

from __future__ import annotations

import threading

import pytest

from cloud_api.errors import Conflict
from cloud_api.home import ModelHome
from cloud_api.jobs import queue, specs
from cloud_api.jobs.requests import PretrainRequest
from cloud_api.settings import Settings
from cloud_api.store.db import Database
from tests.cloud_api.jobs.conftest import ETA


def _then_wait(real, barrier: threading.Barrier):
    """``real``, then a wait at ``barrier`` (a racer left alone goes on after its timeout)."""

    def held(*a, **kw):
        out = real(*a, **kw)
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        return out

    return held


def _after_every_check(monkeypatch, barrier: threading.Barrier) -> None:
    """Let every racer finish its "is the name free?" look-up before any inserts: the
    worst interleaving, every time."""
    monkeypatch.setattr(queue, "live_holder", _then_wait(queue.live_holder, barrier))


def test_two_pretrain_requests_for_one_name_queue_one_job_and_409(db, db_url, tmp_path,
                                                                   monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a public sentence\n")
    settings = Settings(home=tmp_path / "home", pretrain_corpus=corpus)
    home = ModelHome(settings.home).ensure()
    req = PretrainRequest(objective="denoising", mechanism="dchi-text",
                          params={"eta": ETA}, steps=5, name="pre")
    racers = 4
    _after_every_check(monkeypatch, threading.Barrier(racers, timeout=5))
    start = threading.Barrier(racers, timeout=30)
    queued: list[int] = []
    refused: list[Conflict] = []
    errors: list[BaseException] = []

    def submit() -> None:
        own = Database(db_url, busy_timeout_s=30.0)
        try:
            start.wait()
            queued.append(specs.submit_pretrain(own, home, settings, req, created_by="k"))
        except Conflict as exc:
            refused.append(exc)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            own.dispose()

    threads = [threading.Thread(target=submit) for _ in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(queued) == 1 and len(refused) == racers - 1, (queued, refused)
    assert all(e.status == 409 and "'pre'" in e.detail for e in refused)
    assert [j.id for j in queue.list_jobs(db, kind="pretrain")] == queued


def test_a_reserved_name_is_free_again_once_its_job_has_ended(db):
    first = queue.enqueue(db, "pretrain", {"name": "pre"}, reserve="pre")
    with pytest.raises(Conflict, match=f"job {first} \\(queued\\) already holds"):
        queue.enqueue(db, "pretrain", {"name": "pre"}, reserve="pre")
    queue.enqueue(db, "retrain", {}, reserve="pre")  # another kind: another namespace
    queue.enqueue(db, "pretrain", {"name": "other"}, reserve="other")
    job = queue.claim(db, "w")
    assert job.id == first
    with pytest.raises(Conflict, match="running"):
        queue.enqueue(db, "pretrain", {"name": "pre"}, reserve="pre")
    assert queue.finish(db, first, "w", "failed", error="boom")
    again = queue.enqueue(db, "pretrain", {"name": "pre"}, reserve="pre")
    assert queue.live_holder(db, "pretrain", "pre").id == again


def _output(folder):
    """An attempt folder whose ``output/`` is a (fake) complete model version."""
    from cloud_api.jobs.files import AttemptFiles

    files = AttemptFiles(folder)
    files.prepare({"job_id": folder.name})
    files.output.mkdir()
    (files.output / "config.json").write_text("{}")
    return files


def test_two_jobs_finishing_together_promote_one_version_and_say_why(db, tmp_path,
                                                                    monkeypatch):
    """Both children decided "promote" against the same promoted version (none); their
    workers publish at once. Every racer reads the pointer before any writes it when
    nothing serializes them (the patched read waits for the other): both promoted before.
    Now exactly one promotes and the other's result says why it did not (its comparison
    with the winner fails: these fake versions have no weights and their jobs no task)."""
    from cloud_api.jobs.attempt import Attempt
    from cloud_api.jobs.supervisor import Worker

    home = ModelHome(tmp_path / "home").ensure()
    for _ in (1, 2):
        queue.enqueue(db, "retrain", {"model_id": "m"})
        queue.claim(db, "w")
    together = threading.Barrier(2, timeout=3)
    real = ModelHome.promoted
    monkeypatch.setattr(ModelHome, "promoted", _then_wait(real, together))
    result = {"promote": {"requested": True, "decision": True,
                          "reason": "no version was promoted before"},
              "compared_with": {"version": None}, "records": {"test": 10},
              "metrics": {"test_accuracy": 0.5}}
    worker = Worker(Settings(home=home.root), db, home, worker_id="w")
    out: dict[int, dict] = {}

    def publish(job_id: int) -> None:
        attempt = Attempt(worker, queue.get(db, job_id))
        _output(attempt.files.dir)
        out[job_id] = worker.publisher.publish(attempt, result)

    threads = [threading.Thread(target=publish, args=(i,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r["version"] for r in out.values()) == ["v1", "v2"]
    won = [r for r in out.values() if r["promoted"]]
    lost = [r for r in out.values() if not r["promoted"]]
    assert len(won) == 1 and len(lost) == 1, out
    monkeypatch.setattr(ModelHome, "promoted", real)
    assert home.promoted("m") == won[0]["version"]
    assert won[0]["promotion"] == "no version was promoted before"
    why = lost[0]["promotion"]
    assert why.startswith(f"not promoted: the promoted version changed while the job ran "
                          f"(none -> {won[0]['version']}"), why
    assert f"the promoted {won[0]['version']} could not be evaluated (KeyError" in why, why
    assert lost[0]["compared_with"]["version"] == won[0]["version"]


def _test_rows(env):
    """The test rows of the task's records, split as a retraining job splits them."""
    from cloud_api.jobs.retrain import load_snapshot, split_rows

    return split_rows(load_snapshot(env.settings(), env.task, None)[1])["test"]


def test_the_later_of_two_jobs_is_compared_again_with_the_version_the_first_promoted(
        job_env, monkeypatch):
    """Two real retraining jobs train at once and both compare with "none"; their workers
    publish together. The first promotes; the second is no longer refused: a comparison
    child measures the version the first promoted on the second's test rows, and the job's
    rule decides. Its result names that version and both accuracies."""
    from cloud_api.jobs.publisher import Publisher
    from cloud_api.jobs.retrain import promotion_decision
    from cloud_api.jobs.supervisor import Worker
    from models.training.experiment import evaluate_records
    from tests.cloud_api.jobs.test_worker import submit

    db, home = job_env.database(), ModelHome(job_env.home)
    ids = [submit(job_env, epochs=1, promote=True),
           submit(job_env, epochs=2, lr=3e-3, promote=True)]
    together = threading.Barrier(2, timeout=300)
    real = Publisher.publish

    def publish(self, attempt, result):  # both children are done before either publishes
        together.wait()
        return real(self, attempt, result)

    monkeypatch.setattr(Publisher, "publish", publish)
    # the job that finishes first sends no heartbeat while it waits at the barrier for the
    # other to train: a reaper must not take it back meanwhile, however slow the machine
    settings = job_env.settings(heartbeat_timeout_s=600)
    workers = [Worker(settings, db, home, worker_id=f"w{i}") for i in (1, 2)]
    threads = [threading.Thread(target=w.run, kwargs={"once": True}) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    jobs = [queue.get(db, i) for i in ids]
    assert [j.state for j in jobs] == ["succeeded"] * 2, [(j.error, j.log_tail) for j in jobs]
    first, second = sorted((j.result for j in jobs), key=lambda r: r["promotion"] !=
                           "no version was promoted before")
    assert first["promoted"] and first["compared_with"]["version"] is None
    was = second["compared_with"]
    assert was["version"] == first["version"] and was["error"] is None, second
    assert was["at_training"]["version"] is None
    cur = evaluate_records(home.version_dir("m", first["version"]),
                           _test_rows(job_env))["accuracy"]
    assert was["test_accuracy"] == pytest.approx(cur, abs=1e-9)
    new, n = second["metrics"]["test_accuracy"], second["records"]["test"]
    promote, why = promotion_decision(True, new, first["version"], cur, n)
    assert second["promoted"] == promote
    assert second["promotion"].endswith(f"compared again with {first['version']}: {why}")
    assert f"(none -> {first['version']}" in second["promotion"]
    assert f"{new:.4f} against {cur:.4f} of {first['version']}" in second["promotion"]
    assert home.promoted("m") == (second if promote else first)["version"]
    assert home.versions("m") == ["v1", "v2"]


@pytest.mark.parametrize("meanwhile", ["unreadable", "erased"])
def test_a_comparison_that_cannot_be_made_promotes_nothing_and_says_why(job_env, monkeypatch,
                                                                        meanwhile):
    """While a real job ran, an admin promoted another version: one that cannot be
    evaluated (a version folder without weights), or a copy of a good one while a test
    record of the job was erased (the same test rows no longer exist). The comparison
    child fails; the pointer stays where the admin put it and the result says why."""
    from cloud_api.jobs.publisher import Publisher
    from cloud_api.jobs.retrain import split_of
    from cloud_api.jobs.supervisor import Worker
    from cloud_api.store.records import delete_records
    from tests.cloud_api.jobs.test_worker import submit

    db, home = job_env.database(), ModelHome(job_env.home)
    job_id = submit(job_env, epochs=1, promote=True)
    real = Publisher.publish

    def publish(self, attempt, result):  # what an admin did just before
        if meanwhile == "unreadable":
            src = _output(job_env.home.parent / "admin").output
        else:
            src = attempt.files.output
            erased = next(i for i in range(1, 97) if split_of(i) == "test")
            assert delete_records(db, ids=[erased]) == 1
        home.promote("m", home.register("m", src))
        return real(self, attempt, result)

    monkeypatch.setattr(Publisher, "publish", publish)
    assert Worker(job_env.settings(), db, home).run(once=True) == "succeeded"
    res = queue.get(db, job_id).result
    assert res["version"] == "v2" and not res["promoted"] and home.promoted("m") == "v1"
    why = res["promotion"]
    assert why.startswith("not promoted: the promoted version changed while the job ran "
                          "(none -> v1"), why
    assert "compared again with v1: the promoted v1 could not be evaluated (" in why, why
    was = res["compared_with"]
    assert was["version"] == "v1" and was["test_accuracy"] is None and was["error"] in why
    assert was["at_training"]["version"] is None
    if meanwhile == "erased":
        n = res["records"]["test"]
        assert f"test records changed since it trained ({n} then, {n - 1} now" in why, why


def test_the_promotion_lock_holds_off_other_processes(tmp_path):
    """A process holding the model's promotion lock keeps every other promotion of that
    model waiting until it lets go."""
    import subprocess
    import sys
    import textwrap

    home = ModelHome(tmp_path / "home").ensure()
    src = _output(tmp_path / "a").output
    assert home.register("m", src) == "v1"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from cloud_api.home import ModelHome
        with ModelHome({str(home.root)!r}).promotion_lock("m"):
            print("held", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        done = threading.Event()
        t = threading.Thread(target=lambda: (home.promote("m", "v1"), done.set()))
        t.start()
        assert not done.wait(1.0) and home.promoted("m") is None
        holder.stdin.close()
        assert done.wait(20) and home.promoted("m") == "v1"
        t.join(5)
    finally:
        holder.kill()
        holder.wait()


RANKS_SCRIPT = '''
import os, signal, sys
import torch.distributed as dist
from cloud_api.jobs.files import AttemptFiles

files, mode = AttemptFiles(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    if mode == "kill":  # what the out-of-memory killer does
        os.kill(os.getpid(), signal.SIGKILL)
    files.write_error("ValueError: rank 1 gave up")
    sys.exit(1)
try:
    dist.barrier()  # rank 1 is gone: the connection to it breaks (or torchrun stops us)
except Exception as exc:
    files.write_error(f"RuntimeError: {type(exc).__name__} in a collective")
    sys.exit(1)
'''


@pytest.mark.parametrize("mode", ["kill", "raise"])
def test_a_torchrun_rank_killed_by_a_signal_is_retried_one_that_fails_is_not(
        tmp_path, monkeypatch, mode):
    """A real 2-process gloo torchrun (through the worker's launcher) whose rank 1 SIGKILLs
    itself: torchrun exits 1, yet the job is queued again like a single process killed by
    a signal, and says which rank died of what. Rank 1 failing with an error fails it."""
    from cloud_api.jobs import children
    from cloud_api.jobs.supervisor import Worker

    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    real = children.child_command

    def command(attempt_dir, nproc=0, torchrun_args=""):
        cmd = real(attempt_dir, nproc, torchrun_args)
        assert cmd[-3:] == ["-m", "cloud_api.jobs.run", str(attempt_dir)]
        return [*cmd[:-3], str(script), str(attempt_dir), mode]

    monkeypatch.setattr(children, "child_command", command)
    home = ModelHome(tmp_path / "home").ensure()
    db = Database(f"sqlite:///{tmp_path / 'jobs.db'}")
    db.upgrade()
    try:
        job_id = queue.enqueue(db, "pretrain", {"name": "pre"}, max_attempts=2)
        settings = Settings(home=home.root, heartbeat_s=0.2, device="cpu")
        worker = Worker(settings, db, home, worker_id="w", torchrun_nproc=2)
        state = worker.run_job(queue.claim(db, "w"))
        job = queue.get(db, job_id)
    finally:
        db.dispose()
    if mode == "kill":
        assert state == "queued" and job.state == "queued" and job.attempts == 1, job.error
        assert job.error.startswith("torchrun rank 1 was killed by SIGKILL (out of memory?)")
        assert job.error.endswith("; queued again")
    else:
        assert state == "failed" and job.state == "failed", job.error
        assert job.error == "ValueError: rank 1 gave up"
