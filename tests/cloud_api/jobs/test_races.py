"""Races of the job queue closed in issue 12: two pretraining requests for one base name
(one job and one 409, on SQLite and PostgreSQL), two retraining jobs promoting the same
model at once (one promotes, the other says why not), and a torchrun rank killed by a
signal (retried like a single process killed by one)."""

from __future__ import annotations

import threading

import pytest

from cloud_api.errors import Conflict
from cloud_api.home import ModelHome
from cloud_api.jobs import specs
from cloud_api.settings import Settings
from cloud_api.store import jobs as queue
from cloud_api.store.db import Database


def _after_every_check(monkeypatch, barrier: threading.Barrier) -> None:
    """Let every racer finish its "is the name free?" look-up before any inserts: the
    worst interleaving, every time (a racer left alone goes on after the timeout)."""
    for name in ("live_holder", "list_jobs"):
        real = getattr(queue, name, None)
        if real is None:
            continue

        def held(*a, _real=real, **kw):
            out = _real(*a, **kw)
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass
            return out

        monkeypatch.setattr(queue, name, held)


def test_two_pretrain_requests_for_one_name_queue_one_job_and_409(db, db_url, tmp_path,
                                                                   monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a public sentence\n")
    settings = Settings(home=tmp_path / "home", pretrain_corpus=corpus)
    home = ModelHome(settings.home).ensure()
    req = specs.PretrainRequest(objective="denoising", mechanism="dchi-text",
                                params={"eta": 10}, steps=5, name="pre")
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
