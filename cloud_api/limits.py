"""Per-key rate limiting: a token bucket per key id (requests per second with a burst).

Pure and thread-safe; the HTTP layer answers 429 with ``Retry-After`` when
:meth:`RateLimiter.acquire` returns a wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimiter:
    """``rate`` tokens per second, at most ``burst`` saved, one bucket per key id.

    ``rate == 0`` disables the limit. Buckets idle long enough to be full again are
    dropped, so memory stays bounded by the keys active in the last ``burst/rate`` s.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        if rate < 0 or burst < 1:
            raise ValueError("rate must be >= 0 and burst >= 1")
        self.rate = float(rate)
        self.burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def acquire(self, key: str, cost: float = 1.0) -> float:
        """Take ``cost`` tokens for ``key``: 0.0 if allowed, else the seconds to wait."""
        if self.rate == 0:
            return 0.0
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= cost:
                self._buckets[key] = (tokens - cost, now)
                if len(self._buckets) > 10_000:
                    self._evict(now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (cost - tokens) / self.rate

    async def acquire_async(self, key: str, cost: float = 1.0) -> float:
        """:meth:`acquire` for the request path (the same interface as the database's
        shared limiter, ``cloud_api.store.rate_limits``; no I/O here)."""
        return self.acquire(key, cost)

    def _evict(self, now: float) -> None:
        full_after = self.burst / self.rate
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < full_after}
