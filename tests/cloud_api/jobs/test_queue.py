"""The job queue on SQLite and a real PostgreSQL: atomic claims under a race, owner-only
heartbeats, the reaper, cancel, release."""

from __future__ import annotations

import threading

import pytest

from cloud_api.errors import Conflict, NotFound
from cloud_api.jobs import queue
from cloud_api.jobs.states import JobKind, JobState
from cloud_api.store.db import Database


def test_four_workers_racing_over_100_jobs_claim_each_exactly_once(db, db_url):
    """25 rounds; in each, the 4 workers (each with its own connections) leave a barrier
    together and claim at once, so every round is a real race for the queue's head."""
    ids = [queue.enqueue(db, "retrain", {"n": i}) for i in range(100)]
    claimed: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    rounds = threading.Barrier(4, timeout=60)

    def work(name: str) -> None:
        own = Database(db_url, busy_timeout_s=30.0)
        mine = claimed.setdefault(name, [])
        try:
            for _ in range(25):
                rounds.wait()
                job = queue.claim(own, name)
                assert job is not None, "a queued job was not claimable"
                mine.append(job.id)
                assert job.state == "running" and job.worker_id == name
            rounds.wait()
            assert queue.claim(own, name) is None  # nothing left: no job was claimed twice
            for i in mine:
                assert queue.finish(own, i, name, "succeeded")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            rounds.abort()
        finally:
            own.dispose()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    every = [i for got in claimed.values() for i in got]
    assert sorted(every) == ids  # each job exactly once
    assert all(len(got) == 25 for got in claimed.values())
    done = queue.list_jobs(db, limit=1000)
    assert {j.state for j in done} == {"succeeded"}
    assert {j.attempts for j in done} == {1}
    owner = {i: name for name, got in claimed.items() for i in got}
    assert all(j.worker_id == owner[j.id] for j in done)


def test_states_and_kinds_are_stored_and_answered_as_the_same_strings(db):
    """Members go in, plain strings are stored (the check constraints of migration 0002
    and rows written before the enums); rows read back as members; the admin routes'
    schema names the same words."""
    from typing import get_args

    from sqlalchemy import select

    from cloud_api.routes import admin_jobs

    job_id = queue.enqueue(db, JobKind.PRETRAIN, {})
    queue.claim(db, "w")
    with db.begin() as conn:
        row = conn.execute(select(queue.jobs.c.kind, queue.jobs.c.state)
                           .where(queue.jobs.c.id == job_id)).one()
    assert tuple(row) == ("pretrain", "running") and type(row.state) is str
    job = queue.get(db, job_id)
    assert job.kind is JobKind.PRETRAIN and job.state is JobState.RUNNING
    assert not job.finished and queue.finish(db, job_id, "w", "failed")
    assert queue.get(db, job_id).state is JobState.FAILED and queue.get(db, job_id).finished
    assert get_args(admin_jobs.State) == tuple(JobState)
    with pytest.raises(ValueError, match="unknown job kind 'train'"):
        queue.enqueue(db, "train", {})


def test_claim_takes_the_oldest_and_only_the_owner_heartbeats_or_finishes(db):
    first = queue.enqueue(db, "retrain", {"task": "a"}, created_by="k1")
    queue.enqueue(db, "pretrain", {"name": "b"})
    job = queue.claim(db, "w1")
    assert job.id == first and job.attempts == 1 and job.created_by == "k1"
    assert job.heartbeat_at is not None and job.started_at is not None
    assert queue.heartbeat(db, first, "w2") == queue.Beat(False)
    assert queue.heartbeat(db, first, "w1", progress={"step": 3, "total": 9},
                           log_tail="x" * 10000) == queue.Beat(True, False)
    got = queue.get(db, first)
    assert got.progress == {"step": 3, "total": 9}
    assert len(got.log_tail) == queue.LOG_TAIL_CHARS
    assert not queue.finish(db, first, "w2", "succeeded")
    assert queue.finish(db, first, "w1", "succeeded", result={"version": "v2"})
    assert not queue.finish(db, first, "w1", "failed")  # finished: no longer running
    assert queue.get(db, first).public()["version"] == "v2"
    assert queue.claim(db, "w1").kind == "pretrain"
    assert queue.claim(db, "w1") is None


def test_watermark_is_kept_across_attempts(db):
    job_id = queue.enqueue(db, "retrain", {"task": "a"})
    job = queue.claim(db, "w1")
    assert queue.set_watermark(db, job_id, "w1", 40) == 40
    assert queue.set_watermark(db, job_id, "w1", 55) == 40  # the first one stays
    assert queue.set_watermark(db, job_id, "w2", 55) is None  # not w2's job
    assert queue.release(db, job_id, "w1", "worker stopped")
    again = queue.claim(db, "w2")
    assert again.id == job.id and again.watermark == 40
    assert again.attempts == 1  # a release does not count the attempt


def test_reaper_requeues_while_attempts_are_left_then_fails(db):
    job_id = queue.enqueue(db, "retrain", {"task": "a"}, max_attempts=2)
    queue.claim(db, "w1")
    assert queue.reap(db, timeout_s=60) == []  # a fresh heartbeat is not stale
    assert queue.reap(db, timeout_s=0) == [(job_id, "queued")]
    job = queue.get(db, job_id)
    assert job.state == "queued" and job.worker_id is None
    assert "w1 sent no heartbeat" in job.error and "queued again" in job.error
    assert not queue.heartbeat(db, job_id, "w1").owned  # the old owner lost it
    queue.claim(db, "w2")
    assert queue.reap(db, timeout_s=0) == [(job_id, "failed")]
    job = queue.get(db, job_id)
    assert job.state == "failed" and job.finished_at is not None
    assert "attempt 2 of 2" in job.error and "no attempts left" in job.error
    assert not queue.finish(db, job_id, "w2", "succeeded")


def test_cancel_queued_running_and_finished_jobs(db):
    queued = queue.enqueue(db, "retrain", {})
    running = queue.enqueue(db, "retrain", {})
    assert queue.request_cancel(db, queued).state == "cancelled"
    assert queue.claim(db, "w1").id == running  # the cancelled one is never claimed
    job = queue.request_cancel(db, running)
    assert job.state == "running" and job.cancel_requested
    assert queue.request_cancel(db, running).cancel_requested  # asking twice is fine
    assert queue.heartbeat(db, running, "w1") == queue.Beat(True, True)
    assert queue.finish(db, running, "w1", "cancelled")
    for job_id in (queued, running):
        with pytest.raises(Conflict, match="already finished"):
            queue.request_cancel(db, job_id)
    with pytest.raises(NotFound):
        queue.request_cancel(db, 10**9)
    with pytest.raises(NotFound):
        queue.get(db, 10**9)


def test_reaper_ends_a_stale_job_being_cancelled_as_cancelled(db):
    job_id = queue.enqueue(db, "retrain", {}, max_attempts=3)
    queue.claim(db, "w1")
    queue.request_cancel(db, job_id)
    assert queue.reap(db, timeout_s=0) == [(job_id, "cancelled")]


def test_list_jobs_filters_and_pages(db):
    ids = [queue.enqueue(db, "retrain" if i % 2 else "pretrain", {}) for i in range(6)]
    queue.claim(db, "w1")
    assert [j.id for j in queue.list_jobs(db)] == ids[::-1]
    assert [j.id for j in queue.list_jobs(db, states=("running",))] == [ids[0]]
    assert [j.id for j in queue.list_jobs(db, kind="retrain", limit=2)] == [ids[5], ids[3]]
    assert [j.id for j in queue.list_jobs(db, before_id=ids[2])] == [ids[1], ids[0]]
