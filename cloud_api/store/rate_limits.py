"""Per-key rate limits shared by every replica: one token bucket per key id in the database
(``rate_buckets``), refilled and taken in one statement (``PRIVBERT_RATE_LIMIT_STORE=
database``).

    limiter = SharedRateLimiter(db, rate=200, burst=400)
    wait = limiter.acquire(key_id)          # 0.0: admitted; else seconds until a token
    wait = await limiter.acquire_async(key_id)

The same bucket as :class:`cloud_api.limits.RateLimiter` (``rate`` tokens a second, at most
``burst`` saved), kept where every replica reads and writes it: the ``INSERT ... ON CONFLICT
DO UPDATE`` below refills the key's row by the time since it was last counted (in the
database's clock, so the replicas' clocks do not matter), takes ``cost`` tokens when they
are there, and returns whether it did, all under the row's lock. However many replicas a
key's requests reach, they are admitted as one bucket would admit them: at most
``burst + rate * t`` in any ``t`` seconds. One round trip per request (in a thread, away
from the event loop), committed without waiting for the disk (``synchronous_commit
off`` for this transaction only: a crash may forget the last takes of a bucket, which
gives a key back a few tokens it had used, never a record or a charge); a database that
cannot be reached answers 503
(:class:`cloud_api.errors.Unavailable`), as the budgets that every prediction charges do.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from cloud_api.store.db import Database

_NOW = {"postgresql": "extract(epoch from clock_timestamp())::float8",
        "sqlite": "((julianday('now') - 2440587.5) * 86400.0)"}
_LEAST = {"postgresql": "least", "sqlite": "min"}
_NO_FLUSH = text("SET LOCAL synchronous_commit TO off")

# refilled = least(burst, tokens + (now - at) * rate); admitted when refilled >= cost. Every
# SET expression reads the row as it was (SQL's rule), so they agree on one refill.
_TAKE = """
INSERT INTO rate_buckets AS b (key_id, tokens, at, admitted)
VALUES (:key, :burst - :cost, {now}, :yes)
ON CONFLICT (key_id) DO UPDATE SET
    tokens = {refilled} - CASE WHEN {refilled} >= :cost THEN :cost ELSE 0 END,
    at = {now},
    admitted = {refilled} >= :cost
RETURNING tokens, admitted
"""


class SharedRateLimiter:
    """See the module docstring; ``rate == 0`` disables the limit."""

    def __init__(self, db: Database, rate: float, burst: int):
        if rate < 0 or burst < 1:
            raise ValueError("rate must be >= 0 and burst >= 1")
        self.db = db
        self.rate = float(rate)
        self.burst = float(burst)
        now = _NOW[db.dialect]
        refilled = f"{_LEAST[db.dialect]}(:burst, b.tokens + ({now} - b.at) * :rate)"
        self._sql = text(_TAKE.format(now=now, refilled=refilled))

    def acquire(self, key: str, cost: float = 1.0) -> float:
        """Take ``cost`` tokens for ``key``: 0.0 if admitted, else the seconds to wait."""
        if self.rate == 0:
            return 0.0
        params = {"key": key, "burst": self.burst, "cost": float(cost), "rate": self.rate,
                  "yes": True}
        with self.db.begin(write=True) as conn:
            if self.db.dialect == "postgresql":  # a bucket need not survive a crash: no
                conn.execute(_NO_FLUSH)           # waiting for the WAL flush at commit
            tokens, admitted = conn.execute(self._sql, params).one()
        return 0.0 if admitted else max(0.0, (cost - float(tokens)) / self.rate)

    async def acquire_async(self, key: str, cost: float = 1.0) -> float:
        if self.rate == 0:
            return 0.0
        return await asyncio.to_thread(self.acquire, key, cost)
