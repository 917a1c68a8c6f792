"""The models the service serves: every promoted version of ``$PRIVBERT_HOME``, each behind
its own micro-batcher, swapped without a restart.

    served = ServedModels(settings, home, bundles)
    await served.start()                     # loads every promoted version (warmed)
    pred = await served.predict("sst2", payloads)
    pred.version, pred.labels, pred.probs    # the version that answered
    await served.promote("sst2", "v3")       # or a pointer written by another process
    await served.stop()                      # drain queues, then unload

Hot swap: the new version is loaded beside the old one in a thread
(:func:`~cloud_api.serving.loading.load_version`; the event loop keeps serving), then new
requests go to the new version, requests already queued finish on the old one, then the old
batcher drains and the old version is released. Choosing a version and queueing on it
happen with no ``await`` in between, so no request can land on a batcher that is draining.
A version that fails to load (one that is not whole included: ``models.versions.manifest``) is
logged, counted (``privbert_model_load_failure``) and shown in :meth:`ready`; the previous
version keeps serving. A prediction whose scores are not all finite is never answered: a
500 ``non-finite-scores`` (counted, ``privbert_predictions_nonfinite``), and the route
refunds its charge. Promotions by other processes (the
CLI, the job worker, another server sharing the home) are noticed by reading the
``promoted`` pointer files every ``settings.reload_interval_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cloud_api import metrics
from cloud_api.errors import (
    InvalidRequest,
    NonFiniteScores,
    NotFound,
    ServiceError,
    Unavailable,
)
from cloud_api.home import ModelHome, version_number
from cloud_api.serving.backends import BackendError
from cloud_api.serving.batcher import Batcher
from cloud_api.serving.bundles import BundleStore
from cloud_api.serving.loading import Served, load_version
from cloud_api.serving.payload_queue import Disconnected
from cloud_api.settings import Settings
from models.versions.manifest import IntegrityError
from shared.arrays import Limits
from shared.mechanisms import registry as mechanisms

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    """Probabilities (N, C) of one request, in input order, and the version that answered."""

    model_id: str
    version: str
    labels: list[str]
    probs: np.ndarray


def _non_finite(model_id: str, version: str, probs: np.ndarray) -> NonFiniteScores:
    """The refusal of a prediction with a NaN or infinite score (counted, logged)."""
    bad = np.flatnonzero(~np.isfinite(probs).all(axis=1))
    metrics.NONFINITE.labels(model=model_id, version=version).inc(len(bad))
    log.error("model %s %s gave non-finite scores for %d of %d payloads: its files may be "
              "corrupt (cloud-api models verify)", model_id, version, len(bad), len(probs))
    return NonFiniteScores(f"model {model_id} {version} gave non-finite scores for "
                           f"payloads[{int(bad[0])}]" + (f" and {len(bad) - 1} more"
                                                         if len(bad) > 1 else "") +
                           "; nothing is answered and nothing is charged (the charge is "
                           "refunded). The operator is alerted by "
                           "privbert_predictions_nonfinite_total")


class ServedModels:
    """Loaded versions by model id, their batchers, promotions and readiness."""

    def __init__(self, settings: Settings, home: ModelHome, bundles: BundleStore):
        self.settings = settings
        self.home = home
        self.bundles = bundles
        self._served: dict[str, Served] = {}
        self._failed: dict[str, tuple[str, str]] = {}  # model -> (version, reason)
        self._failed_stamp: dict[str, tuple | None] = {}  # the pointer file then
        self._locks: dict[str, asyncio.Lock] = {}
        self._retiring: dict[asyncio.Task, tuple[str, str]] = {}  # draining versions
        self._poller: asyncio.Task | None = None
        self._started = False
        self._stopping = False

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Load every promoted version (one after the other, in a thread), then poll
        the pointer files."""
        self._stopping = False
        await self.refresh()
        self._started = True
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(
                self._poll(), name="served-models-poll")

    async def stop(self) -> None:
        """Stop polling, finish every queued request, then unload every version."""
        self._stopping = True
        if self._poller is not None:
            self._poller.cancel()
            try:
                await self._poller
            except asyncio.CancelledError:
                pass
            self._poller = None
        served, self._served = list(self._served.values()), {}
        await asyncio.gather(*(self._release(s) for s in served), *list(self._retiring))
        self._started = False

    async def wait_retired(self) -> None:
        """Wait until every replaced version has drained and been released."""
        while self._retiring:
            await asyncio.gather(*list(self._retiring), return_exceptions=True)

    # -- queries ----------------------------------------------------------------------------
    def ready(self) -> tuple[bool, dict[str, str]]:
        """(True when every promoted model has a loaded and warmed version answering,
        {model_id: what is wrong}). A promoted version that failed to load while an older
        one keeps serving is listed but does not make the service unready."""
        if not self._started:
            return False, {"*": "models are loading"}
        problems: dict[str, str] = {}
        ok = True
        try:
            pointers = self.home.promoted_all()
        except OSError as exc:
            return False, {"*": f"cannot read the model home ({exc.strerror})"}
        for model_id, version in sorted(pointers.items()):
            served = self._served.get(model_id)
            failed = self._failed.get(model_id)
            if served is not None and served.version == version:
                continue
            if failed is not None and not self._wants(model_id, version):
                now = f"; serving {served.version}" if served else "; nothing served"
                problems[model_id] = f"{failed[0]} failed to load: {failed[1]}{now}"
            elif served is not None:
                problems[model_id] = f"loading {version}; serving {served.version}"
            else:
                problems[model_id] = f"loading {version}"
            ok = ok and served is not None
        for model_id, (version, reason) in self._failed.items():
            if model_id not in problems and pointers.get(model_id) != version:
                problems[model_id] = f"promotion to {version} failed: {reason}"
        return ok, problems

    def describe(self) -> list[dict]:
        """One entry per served model (GET /v1/models), sorted by id."""
        return [dict(self._served[m].info) for m in sorted(self._served)]

    def loaded(self) -> list[tuple[str, str]]:
        """(model_id, version) of every version in memory, draining ones included."""
        out = [(s.model_id, s.version) for s in self._served.values()]
        out += list(self._retiring.values())
        return sorted(out)

    def served_version(self, model_id: str) -> str | None:
        s = self._served.get(model_id)
        return s.version if s else None

    def length_for_task(self, task: str, mechanism: str, params: dict, bundle_id: str
                        ) -> tuple[int, str] | None:
        """(max_length, model id) of the served model of ``task`` that reads its payloads
        (the same mechanism, parameters and bundle) with the fewest tokens, or None: records
        of a task are held to the length its model reads, as predictions are. Safe from any
        thread (one copy of the served versions, taken at once)."""
        compared = mechanisms.get(mechanism).compared_params
        found = [(int(s.info["max_length"]), s.model_id) for s in tuple(self._served.values())
                 if s.info.get("task") == task and s.info["mechanism"] == mechanism
                 and s.info["bundle_id"] == bundle_id
                 and not mechanisms.differing_params(compared(s.info["params"]),
                                                     compared(params))]
        return min(found) if found else None

    def limits_for(self, model_id: str) -> Limits:
        """Limits to parse the request bodies of ``model_id``."""
        return self._get(model_id).checker.limits()

    def info_of(self, model_id: str) -> dict:
        """The /v1/models entry of the version serving ``model_id`` now (its mechanism,
        parameters, bundle and guarantee: what its payloads are charged from)."""
        return self._get(model_id).info

    def check(self, model_id: str, payloads: Sequence) -> object:
        """PayloadMismatch unless every payload fits the version serving ``model_id``;
        returns a token of that version, for :meth:`predict`'s ``checked``."""
        checker = self._get(model_id).checker
        checker.check(payloads)
        return checker

    def batcher_of(self, model_id: str) -> Batcher:
        """The batcher of the version serving ``model_id`` now (metrics, tests)."""
        served = self._get(model_id)
        assert served.batcher is not None
        return served.batcher

    def _get(self, model_id: str) -> Served:
        served = self._served.get(model_id)
        if served is not None:
            return served
        failed = self._failed.get(model_id)
        if failed is not None and not self._stopping:
            raise Unavailable(f"model {model_id} is not loaded ({failed[0]} failed to load: "
                              f"{failed[1]})",
                              retry_after=max(1.0, self.settings.reload_interval_s))
        if self._stopping:
            raise Unavailable("the server is shutting down", retry_after=1)
        raise NotFound(f"no model {model_id!r} is served here")

    # -- inference --------------------------------------------------------------------------
    async def predict(self, model_id: str, payloads: Sequence,
                      is_disconnected: Disconnected | None = None,
                      checked: object = None) -> Prediction:
        """Check ``payloads`` against the served version (PayloadMismatch), queue them, and
        return their probabilities and the version that answered (:meth:`admit`, then its
        waiter)."""
        return await self.admit(model_id, payloads, is_disconnected, checked)()

    def admit(self, model_id: str, payloads: Sequence,
              is_disconnected: Disconnected | None = None,
              checked: object = None) -> Callable[[], Awaitable[Prediction]]:
        """Check ``payloads`` against the served version and admit them to its queue now,
        without awaiting (``Batcher.admit``: 413, 429, 503 here, before the caller charges
        anything); the returned coroutine function waits for the prediction. ``checked``:
        what :meth:`check` returned for these payloads; when the same version still serves,
        they are not checked twice."""
        served = self._get(model_id)
        if not payloads:
            raise InvalidRequest("payloads: at least one payload is needed")
        if checked is not served.checker:  # another version was promoted meanwhile
            served.checker.check(payloads)
        batcher = served.batcher
        assert batcher is not None
        # no await between choosing the version and queueing on it (see module docstring)
        wait = batcher.admit(payloads, is_disconnected)

        async def answer() -> Prediction:
            probs = await wait()
            if not np.isfinite(probs).all():
                raise _non_finite(model_id, served.version, probs)
            return Prediction(model_id, served.version, served.labels, probs)
        return answer

    # -- promotions -------------------------------------------------------------------------
    async def promote(self, model_id: str, version: str) -> None:
        """Load ``version`` of ``model_id``, point the model at it and serve it. A version that
        cannot be loaded (one that is not whole included: loading verifies it) leaves the
        pointer and the serving version unchanged (InvalidRequest saying why); an unknown
        version is NotFound."""
        path = self.home.version_dir(model_id, version)
        if version not in await asyncio.to_thread(self.home.versions, model_id):
            raise NotFound(f"model {model_id} has no version {version}")
        try:  # a shared model store: fetched and checked here first (a no-op on disk)
            await asyncio.to_thread(self.home.materialize, model_id, version)
        except IntegrityError as exc:
            raise InvalidRequest(f"version {version} of model {model_id} cannot be served: "
                                 f"{exc}") from None
        async with self._lock(model_id):
            current = self._served.get(model_id)
            if current is None or current.version != version:
                try:
                    served = await self._load(model_id, version)
                except BackendError as exc:
                    raise InvalidRequest(f"version {version} of model {model_id} cannot be "
                                         f"served: {exc}") from None
            await asyncio.to_thread(self.home.promote, model_id, version, verify=False)
            if current is None or current.version != version:
                self._install(served)
        log.info("model %s promoted to %s (%s)", model_id, version, path.name)

    async def refresh(self, retry_failed: bool = False) -> None:
        """Serve what the promoted pointers name now (new models, new versions). A version
        that failed to load is tried again only with ``retry_failed``."""
        if retry_failed:
            self._failed.clear()
        try:
            pointers = await asyncio.to_thread(self.home.promoted_all)
        except OSError as exc:
            log.error("cannot read the promoted pointers: %s", exc)
            return
        for model_id, version in sorted(pointers.items()):
            if self._stopping:
                return
            if self._wants(model_id, version):
                async with self._lock(model_id):
                    if not self._wants(model_id, version) or self._stopping:
                        continue
                    try:
                        served = await self._load(model_id, version)
                    except BackendError as exc:
                        if model_id not in self._served:  # at start-up: nothing of it served
                            await self._fall_back(model_id, version, str(exc))
                        continue
                    if self.home.promoted(model_id) != version:  # moved on meanwhile
                        self._retire(served)
                        continue
                    self._install(served)

    def _wants(self, model_id: str, version: str) -> bool:
        """True unless ``version`` is served, or failed and was not promoted again since."""
        served = self._served.get(model_id)
        if served is not None and served.version == version:
            return False
        failed = self._failed.get(model_id)
        return (failed is None or failed[0] != version
                or self._failed_stamp.get(model_id) != self._pointer_stamp(model_id))

    def _pointer_stamp(self, model_id: str) -> tuple | None:
        """Identity of the pointer file (a promotion replaces it: new inode and mtime)."""
        try:
            st = (self.home.model_dir(model_id) / "promoted").stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reload_interval_s)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the poller die
                log.exception("refreshing the served models failed")

    def _lock(self, model_id: str) -> asyncio.Lock:
        return self._locks.setdefault(model_id, asyncio.Lock())

    # -- loading, swapping, releasing -------------------------------------------------------
    async def _load(self, model_id: str, version: str) -> Served:
        """Load and warm ``version`` in a thread; BackendError (recorded) if it fails."""
        stamp = self._pointer_stamp(model_id)
        try:
            served = await asyncio.to_thread(load_version, self.settings, self.home,
                                           self.bundles, model_id, version)
        except Exception as exc:  # anything a broken folder raises gets the same treatment
            if isinstance(exc, ServiceError):
                reason, expected = exc.detail, True
            elif isinstance(exc, BackendError):
                reason, expected = str(exc), True
            else:  # unexpected: the traceback goes to the log
                reason, expected = f"{type(exc).__name__}: {exc}", False
            self._failed[model_id], self._failed_stamp[model_id] = (version, reason), stamp
            metrics.LOAD_FAILURES.labels(model=model_id).inc()
            log.error("model %s %s failed to load: %s", model_id, version, reason,
                      exc_info=not expected)
            raise BackendError(reason) from None
        return self._with_batcher(served)

    async def _fall_back(self, model_id: str, failed: str, why: str) -> None:
        """The promoted ``failed`` version cannot be loaded and nothing of the model is served
        (a start-up, a restart): serve the newest older version that verifies and loads, and
        say so in the log and ``privbert_model_fallback_total``. The pointer still names
        ``failed`` (an operator restores or promotes); /readyz lists the failure."""
        n = version_number(failed) or 0
        older = [v for v in await asyncio.to_thread(self.home.versions, model_id)
                 if (version_number(v) or 0) < n]
        for version in reversed(older):
            try:
                served = await asyncio.to_thread(load_version, self.settings, self.home,
                                                 self.bundles, model_id, version)
            except Exception as exc:  # noqa: BLE001 (each older version in turn; logged)
                log.warning("model %s: %s cannot be served either (%s)", model_id, version,
                            getattr(exc, "detail", None) or exc)
                continue
            self._install(self._with_batcher(served))
            metrics.FALLBACKS.labels(model=model_id, version=version).inc()
            log.error("model %s: the promoted %s cannot be served (%s); serving %s, the last "
                      "version that verifies, until a whole version is promoted (cloud-api "
                      "models verify)", model_id, failed, why, version)
            return
        log.error("model %s: no version of it verifies; nothing of it is served", model_id)

    def _with_batcher(self, served: Served) -> Served:
        s = self.settings
        served.batcher = Batcher(
            [b.forward for b in served.backends], model_id=served.model_id, version=served.version,
            max_batch_size=s.max_batch_size, max_batch_tokens=s.max_batch_tokens,
            max_wait_ms=s.max_wait_ms, max_queue_size=s.max_queue_size,
            queue_timeout_s=s.queue_timeout_s, inline_when_idle=s.inline_when_idle,
            overhead_tokens=served.backend.overhead_tokens).start()
        return served

    def _install(self, served: Served) -> None:
        """Serve ``served`` from now on; the version it replaces drains in the background."""
        old = self._served.get(served.model_id)
        self._served[served.model_id] = served
        failed = self._failed.get(served.model_id)
        if failed is not None and failed[0] == served.version:
            del self._failed[served.model_id]
        elif failed is not None and (n := version_number(failed[0])) and \
                n < (version_number(served.version) or 0):
            del self._failed[served.model_id]  # an older failure is moot
        metrics.LOADED.labels(model=served.model_id, version=served.version).set(1)
        log.info("serving model %s %s (%s backend)", served.model_id, served.version,
                 served.backend.name)
        if old is not None:
            self._retire(old)

    def _retire(self, old: Served) -> None:
        task = asyncio.get_running_loop().create_task(
            self._release(old), name=f"retire-{old.model_id}-{old.version}")
        self._retiring[task] = (old.model_id, old.version)
        task.add_done_callback(lambda t: self._retiring.pop(t, None))

    async def _release(self, served: Served) -> None:
        """Finish the queued requests of ``served``, then free the model."""
        if served.batcher is not None:
            await served.batcher.drain()
        for b in served.backends:
            await asyncio.to_thread(b.close)
        metrics.drop_series(metrics.LOADED, served.model_id, served.version)
        log.info("released model %s %s", served.model_id, served.version)
