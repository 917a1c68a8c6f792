"""A replica follows the shared model store (``PRIVBERT_MODEL_STORE=database``): every
``PRIVBERT_MODEL_SYNC_INTERVAL_S`` it reads the promotions (one small query), fetches and
checks a newly promoted version into its cache (``StoredHome.sync``, off the event loop),
and has the served models pick it up at once (``ServedModels.refresh``).

    sync = ModelSync(home, served, interval_s=2.0)
    await sync.sync_now()                   # at start, before the replica is ready
    sync.start()                            # then in the background
    sync.ready()                            # (ready, {component: problem}) for /readyz

Why polling and not LISTEN/NOTIFY (docs/deployment.md): a poll every 2 s bounds how late a
replica learns of a promotion (well inside the 10 s asked) whatever happened to its
connection meanwhile, needs no listener to re-arm after an outage, and works through a
transaction-pooling PgBouncer, where LISTEN does not; its cost is one indexed read of a
table with one row per model. A promoted version that cannot be fetched or is not whole
leaves the previous version serving, and ``ready`` lists why; a model with nothing served
at all makes the replica not ready.
"""

from __future__ import annotations

import asyncio
import logging
import time

from cloud_api import metrics
from cloud_api.errors import ServiceError
from cloud_api.home import ModelHome, SyncReport

log = logging.getLogger(__name__)


class ModelSync:
    """See the module docstring; ``served`` is a ``ServedModels`` (anything with an async
    ``refresh()``)."""

    def __init__(self, home: ModelHome, served, interval_s: float):
        self.home = home
        self.served = served
        self.interval_s = interval_s
        self.synced_at: float | None = None  # monotonic time of the last complete read
        self.failed: dict[str, str] = {}
        self.error: str | None = None
        self._task: asyncio.Task | None = None

    async def sync_now(self) -> SyncReport:
        """One pass; ServiceError (503: the database) when the store cannot be read."""
        try:
            report = await asyncio.to_thread(self.home.sync)
        except ServiceError as exc:
            self.error = exc.detail
            raise
        self.error = None
        self.synced_at = time.monotonic()
        metrics.MODEL_SYNC_AGE.set(0.0)
        self.failed = report.failed
        for model_id, version in report.changed.items():
            log.info("model %s: %s promoted in the store, fetched and checked here",
                     model_id, version)
        if report.changed:
            await self.served.refresh()
        return report

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="model-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _loop(self) -> None:
        warned = False
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.sync_now()
                warned = False
            except asyncio.CancelledError:
                raise
            except ServiceError as exc:
                if not warned:  # once per outage, not every interval
                    log.warning("model store unreadable: %s", exc.detail)
                    warned = True
            except Exception:  # never let the loop die
                log.exception("model store sync failed")
            metrics.MODEL_SYNC_AGE.set(self.age())

    def age(self) -> float:
        """Seconds since the promotions were last read whole (inf: never)."""
        return float("inf") if self.synced_at is None else time.monotonic() - self.synced_at

    def ready(self) -> tuple[bool, dict[str, str]]:
        """Not ready before the first complete read, nor while a promoted model has nothing
        here to serve; a version refused while an older one serves is listed only."""
        if self.synced_at is None:
            return False, {"model store": self.error or "not read yet"}
        local = self.home.promoted_all()
        problems = {f"{m} (store)": why for m, why in self.failed.items()}
        ok = all(m in local for m in self.failed)
        return ok, problems
