"""What a per-key rate limit shared through PostgreSQL costs, and where it stops scaling:
takes per second from one key's bucket (every replica's requests of one API key on one row)
against a bucket per thread (keys spread over rows) and the in-memory limiter (one process,
the default), in the same run.

    python -m bench.shared_limits [--seconds 5] [--threads 4]

A throwaway PostgreSQL cluster (tests/pg.py) with its durable defaults (fsync on, every
commit flushed); ``--threads`` threads in this process over two engines (two "replicas"),
each taking one token at a time (rate and burst so high that every take is admitted:
this measures the statement, not refusals). docs/deployment.md's paper plan reads these.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from cloud_api.limits import RateLimiter
from cloud_api.store.db import Database
from cloud_api.store.rate_limits import SharedRateLimiter


def _run(take, threads: int, seconds: float) -> float:
    """Takes per second from ``threads`` threads calling ``take(thread_index)``."""
    counts = [0] * threads
    stop = time.monotonic() + seconds
    start = threading.Barrier(threads)

    def loop(i: int) -> None:
        start.wait()
        n = 0
        while time.monotonic() < stop:
            take(i)
            n += 1
        counts[i] = n

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    from tests.pg import PgCluster

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=4)
    a = ap.parse_args()
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    cluster = PgCluster.create(fsync=True)
    cluster.start()
    dbs = [Database(cluster.url(), pool_size=a.threads) for _ in range(2)]
    try:
        dbs[0].upgrade()
        shared = [SharedRateLimiter(db, rate=1e9, burst=10**9) for db in dbs]
        memory = RateLimiter(1e9, 10**9)
        rows = [
            ("in memory, one key (one process: the default)",
             _run(lambda i: memory.acquire("k"), a.threads, a.seconds)),
            ("PostgreSQL, one key (every thread on one row)",
             _run(lambda i: shared[i % 2].acquire("k"), a.threads, a.seconds)),
            ("PostgreSQL, a key per thread (a row each)",
             _run(lambda i: shared[i % 2].acquire(f"k{i}"), a.threads, a.seconds)),
        ]
    finally:
        for db in dbs:
            db.dispose()
        cluster.destroy()
    print(f"| limiter ({a.threads} threads over 2 engines, {a.seconds:g} s) | takes/s |")
    print("| --- | --- |")
    for what, rate in rows:
        print(f"| {what} | {rate:,.0f} |")
    print(f"one key's row against a row per key: {rows[1][1] / rows[2][1]:.2f}x")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
