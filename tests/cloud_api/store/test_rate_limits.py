"""The per-key rate limit shared by replicas (cloud_api/store/rate_limits.py): one bucket
in the database, whatever connection (replica) takes from it. Each ``Database`` below is a
replica's own engine and pool."""

from __future__ import annotations

import threading

from sqlalchemy import text

from cloud_api.store.db import Database
from cloud_api.store.rate_limits import SharedRateLimiter


def _hammer(limiters: list[SharedRateLimiter], key: str, tries: int) -> list[float]:
    """``tries`` acquisitions from each of 2 threads per limiter, all at once."""
    waits: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(2 * len(limiters))

    def run(limiter: SharedRateLimiter) -> None:
        start.wait()
        for _ in range(tries):
            w = limiter.acquire(key)
            with lock:
                waits.append(w)

    threads = [threading.Thread(target=run, args=(lim,)) for lim in limiters for _ in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return waits


def test_a_key_gets_its_burst_once_over_all_replicas(db_url):
    """rate 0.001/s: over the few seconds of the test at most a hundredth of a token comes
    back, so exactly ``burst`` of the 60 concurrent requests through 2 replicas pass (with a
    bucket per replica 40 would)."""
    replicas = [Database(db_url, busy_timeout_s=10.0) for _ in range(2)]
    try:
        replicas[0].upgrade()
        limiters = [SharedRateLimiter(db, rate=0.001, burst=20) for db in replicas]
        waits = _hammer(limiters, "key-a", tries=15)
        assert len(waits) == 60
        assert sum(w == 0.0 for w in waits) == 20
        assert all(w > 900 for w in waits if w)  # about 1/rate: a whole token is missing
        assert limiters[1].acquire("key-b") == 0.0  # another key has its own bucket
    finally:
        for db in replicas:
            db.dispose()


def test_tokens_come_back_at_the_rate_in_the_databases_clock(db):
    """One token per 100 s and a burst of 1; the bucket's clock is moved back in the
    database instead of sleeping, so the check does not depend on how busy the machine is."""
    limiter = SharedRateLimiter(db, rate=0.01, burst=1)
    assert limiter.acquire("k") == 0.0
    wait = limiter.acquire("k")
    assert 90 < wait <= 100  # a whole token is 100 s away
    with db.begin(write=True) as conn:  # 150 s pass for the bucket: refilled, to 1 at most
        conn.execute(text("UPDATE rate_buckets SET at = at - 150 WHERE key_id = 'k'"))
    assert limiter.acquire("k") == 0.0
    assert limiter.acquire("k") > 90  # one token was all the bucket could hold
    assert SharedRateLimiter(db, rate=0, burst=1).acquire("k") == 0.0  # 0 disables it
