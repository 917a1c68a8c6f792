"""The FastAPI application: ``create_app(settings)``.

    app = create_app(Settings(home="var", api_keys="k1", admin_keys="a1"))

Extending it (records, jobs, ...): append a router module to :data:`ROUTERS` and, when it
needs something started, an ``async def step(app, stack)`` to :data:`LIFESPAN`. Steps run
in order at start; each registers its own shutdown on ``stack`` (an ``AsyncExitStack``),
so components stop in reverse order. ``app.state`` holds ``settings``, ``home``, ``keys``,
``rate_limiter``, ``bundles``, ``compressed_tarballs`` (gzip copies of bundle tarballs),
``served_models`` and ``ready_checks`` (callables returning ``(ready, {component:
problem})``, or an awaitable of it, read by ``/readyz``).

Graceful shutdown: uvicorn stops accepting connections and waits for the requests in
flight; then the lifespan exits and ``served_models.stop()`` drains the batch queues before
the models are unloaded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi

from cloud_api import logs, metrics, problems
from cloud_api.auth import KeyRing
from cloud_api.errors import ServiceError
from cloud_api.home import ModelHome
from cloud_api.limits import RateLimiter
from cloud_api.routes import (
    admin_budgets,
    admin_jobs,
    admin_models,
    admin_records,
    health,
    inference,
    predict,
    records,
    web,
)
from cloud_api.routes.compression import CompressedTarballs
from cloud_api.routes.middleware import ServiceMiddleware
from cloud_api.serving.bundles import BundleStore
from cloud_api.serving.hot_swap import ServedModels
from cloud_api.serving.model_sync import ModelSync
from cloud_api.settings import Settings
from cloud_api.store.model_store import ModelStore
from cloud_api.store.rate_limits import SharedRateLimiter
from cloud_api.store.stored_home import StoredHome

log = logging.getLogger("cloud_api")

LifespanStep = Callable[[FastAPI, AsyncExitStack], Awaitable[None]]

DESCRIPTION = """Privacy-adaptive BERT classifiers that read privatized payloads.

Only privatized payloads (``shared.payload``) reach this service: predict with
``POST /v1/models/{model_id}/predict``. Send ``Authorization: Bearer <key>``: application
keys for ``/v1``, admin keys for ``/admin`` and ``/v1``; ``/healthz``, ``/readyz`` and
``/metrics`` are open. Every error is ``application/problem+json`` (RFC 9457) with a stable
``type`` (``urn:privbert:problem:<kind>``)."""


async def start_metrics(app: FastAPI, stack: AsyncExitStack) -> None:
    """With ``--workers N`` (multiprocess metrics): when this uvicorn process exits, after every
    other step has stopped, its live gauges (in flight, queues, models loaded) leave the
    server's sums; its counters stay."""
    if metrics.multiprocess_dir() is not None:
        stack.callback(metrics.forget_process, os.getpid())


async def start_basics(app: FastAPI, stack: AsyncExitStack) -> None:
    """The home folders, the key ring (refuses to start without keys), the rate limiter."""
    s: Settings = app.state.settings
    app.state.home = ModelHome(s.home).ensure()
    app.state.keys = KeyRing.from_settings(s)
    app.state.rate_limiter = RateLimiter(s.rate_limit_per_key, s.rate_limit_burst)
    app.state.ready_checks = []


async def start_serving(app: FastAPI, stack: AsyncExitStack) -> None:
    """Bundles and the served models (loads every promoted version, starts batchers)."""

    app.state.bundles = BundleStore(app.state.home)
    served_models = ServedModels(app.state.settings, app.state.home, app.state.bundles)
    await served_models.start()
    stack.push_async_callback(served_models.stop)  # drains the batch queues, then unloads
    app.state.served_models = served_models
    app.state.ready_checks.append(served_models.ready)


async def start_shared_state(app: FastAPI, stack: AsyncExitStack) -> None:
    """After the store step (``app.state.db``), before serving: readiness asks the database
    (a replica that cannot reach it is taken out of its Service); with
    ``PRIVBERT_MODEL_STORE=database`` the home is the shared store with ``$PRIVBERT_HOME`` as
    this host's cache, read once now so that serving starts with what is promoted; with
    ``PRIVBERT_RATE_LIMIT_STORE=database`` one token bucket per key for every replica."""
    import asyncio

    s: Settings = app.state.settings
    db = app.state.db
    app.state.ready_checks.append(_database_ready(db, s.ready_db_timeout_s))
    if s.rate_limit_store == "database":
        app.state.rate_limiter = SharedRateLimiter(db, s.rate_limit_per_key, s.rate_limit_burst)
    app.state.model_sync_first = None
    if s.model_store == "database":
        app.state.home = StoredHome(s.home, ModelStore(db)).ensure()
        try:
            app.state.model_sync_first = await asyncio.to_thread(app.state.home.sync)
        except ServiceError as exc:
            log.warning("model store not readable at start (%s): serving what this host "
                        "has; not ready until it is read", exc.detail)


def _database_ready(db, timeout_s: float) -> Callable[[], Awaitable[tuple[bool, dict]]]:
    """A readiness check: the database answers ``SELECT 1`` within ``timeout_s``."""
    import asyncio

    async def check() -> tuple[bool, dict]:
        try:
            await asyncio.wait_for(asyncio.to_thread(db.ping), timeout_s)
        except (ServiceError, TimeoutError):
            return False, {"database": "does not answer"}
        return True, {}
    return check


async def start_model_sync(app: FastAPI, stack: AsyncExitStack) -> None:
    """With ``PRIVBERT_MODEL_STORE=database``: follow the store's promotions
    (``cloud_api.serving.model_sync``); ready only once they were read."""
    s: Settings = app.state.settings
    if s.model_store != "database":
        return
    sync = ModelSync(app.state.home, app.state.served_models, s.model_sync_interval_s)
    if app.state.model_sync_first is not None:  # read at start: take it as the first pass
        import time

        sync.synced_at = time.monotonic()
        sync.failed = app.state.model_sync_first.failed
    sync.start()
    stack.push_async_callback(sync.stop)
    app.state.model_sync = sync
    app.state.ready_checks.append(sync.ready)


# in order: the shared state, the job worker thread and the prediction charges need the
# store (records.start_store: the Database); the store before serving: a version's manifest is
# checked against the digest the database recorded when it was sealed (cloud_api.home);
# start_metrics first, so that its exit runs last
LIFESPAN: list[LifespanStep] = [start_metrics, start_basics, records.start_store,
                                start_shared_state, start_serving, start_model_sync,
                                admin_budgets.start_charges, admin_jobs.start_worker]
ROUTERS: list[APIRouter] = [health.router, inference.router, admin_models.router,
                            records.router, admin_records.router, admin_jobs.router,
                            admin_budgets.router]


@asynccontextmanager
async def lifespan(app: FastAPI):
    async with AsyncExitStack() as stack:
        for step in LIFESPAN:
            await step(app, stack)
        log.info("ready to serve", extra={"home": str(app.state.settings.home)})
        yield
        log.info("shutting down: draining batch queues")


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service for ``settings`` (default: from the environment, PRIVBERT_*)."""
    settings = settings or Settings()
    # FastAPI's native OpenTelemetry is off: it asks the global providers on every request,
    # and the service's metrics are Prometheus (/metrics)
    app = FastAPI(title="privbert", version="1", description=DESCRIPTION, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None, openapi_url="/openapi.json",
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.settings = settings
    app.state.compressed_tarballs = CompressedTarballs()  # gzip copies of bundle tarballs
    problems.install(app)
    predict.install(app)  # first in the router: the hot route is tried first
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(ServiceMiddleware, max_body_bytes=settings.max_body_bytes,
                       max_concurrent=settings.max_concurrent_requests)
    web.install(app, settings)  # last: its CORS layer wraps the service middleware
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def create_app_from_env() -> FastAPI:
    """uvicorn factory (``cloud_api.app:create_app_from_env``) for ``--workers N``."""
    settings = Settings()
    logs.configure(settings.log_level, settings.log_json)
    return create_app(settings)


def _openapi(app: FastAPI) -> dict:
    """The OpenAPI document plus the problem and hand-validated request schemas, and the
    bearer security scheme on ``/v1`` and ``/admin``."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    for route in app.router.routes:  # routes that are not FastAPI's document themselves
        if isinstance(route, predict.PredictRoute):
            route.document(schema)
    problems.add_schemas(schema, problems.Problem, admin_models.PromoteRequest,
                         records.RecordsRequest, records.store.DeleteRecords,
                         admin_records.tasks.TaskDeclaration, admin_jobs.RetrainRequest,
                         admin_jobs.PretrainRequest, admin_budgets.CapRequest)
    schema["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": "application key (/v1) or admin key (/admin, /v1)"}}
    for path, ops in schema.get("paths", {}).items():
        if path.startswith(("/v1/", "/admin/")):
            for op in ops.values():
                op["security"] = [{"bearer": []}]
    app.openapi_schema = schema
    return schema
