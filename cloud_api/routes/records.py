"""``POST /v1/records`` (labelled privatized records of a task) and ``GET /v1/tasks/{task}``.

The records body is validated here, by hand, because what a record may be depends on its
task (labels, mechanism, parameters, bundle): the envelope first, the count (413 above
``max_payloads_per_request``), then every record against the task, and every payload
through the same checks as a prediction's (``serving.checks.PayloadChecker.for_task``: the
same parameter tolerance, and the length the model serving the task reads, where one
does). Only when every record is good is anything written, in one transaction
(``cloud_api.store.records``): a refused request leaves no row anywhere.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from cloud_api import charging
from cloud_api.auth import AppCaller
from cloud_api.errors import NotFound, PayloadMismatch, TooManyPayloads, Unavailable
from cloud_api.home import ID_PATTERN
from cloud_api.metrics import BUDGET_EXHAUSTED, RECORDS
from cloud_api.problems import responses
from cloud_api.routes.common import database, json_response
from cloud_api.serving.checks import PayloadChecker
from cloud_api.store import budgets
from cloud_api.store import records as store
from cloud_api.store.db import Database
from cloud_api.store.seals import DatabaseSeals
from cloud_api.store.tasks import Mechanism, TaskName, get_task
from shared.arrays import Limits
from shared.payload import Record

router = APIRouter(prefix="/v1", tags=["records"])


TaskPath = Annotated[str, Path(description="task name",
                               pattern=ID_PATTERN)]


class RecordsRequest(BaseModel):
    """Labelled privatized records of one task (``shared.payload.Record``): each payload
    made with the task's mechanism, parameters and bundle; each label one of the task's
    class names, or an index into them (TextHide k > 1: a soft label of their length)."""

    model_config = ConfigDict(extra="forbid")
    task: TaskName
    records: list[Record] = Field(min_length=1)


class RecordsResponse(BaseModel):
    ids: list[int] = Field(description="ids of the stored records, in request order")


class TaskInfo(BaseModel):
    """What records of a task must be (what the edge needs to make them)."""

    task: str
    labels: list[str] = Field(description="class names; integer labels index this list")
    mechanism: Mechanism
    params: dict[str, Any]
    bundle_id: str


_CHECKERS: dict[tuple, PayloadChecker] = {}


def _check_as_predictions(task, bundle, recs, max_tokens: int | None,
                          served: tuple[int, str] | None) -> None:
    """Every record's payload through the checks of a prediction (``PayloadChecker``:
    special and [unused] ids, pairs against the task, lengths against the max_length of
    the model serving the task, else the bundle's; ``served``: that model's, from
    ``ServedModels.length_for_task``): a record that a model of the task would refuse to
    read is refused here (422 payload-mismatch), never stored for retraining."""
    key = (task.id, task.name, task.bundle_id, task.pairs, max_tokens, served)
    checker = _CHECKERS.get(key)
    if checker is None:
        checker = _CHECKERS[key] = PayloadChecker.for_task(task, bundle, max_tokens, served)
    found = checker.first_problem([r.payload for r in recs])
    if found is not None:
        i, why = found
        raise PayloadMismatch(f"record {i}: {why}; nothing was stored", errors=[
            {"loc": ["records", i, "payload"], "msg": why, "type": store.MISMATCH}])


def _store(state, env: store.RecordsBody, key_id: str, device_id: str,
           idem: str | None) -> store.Stored:
    """Blocking part of POST /v1/records (a worker thread): task, bundle, checks, the cost
    of the payloads, then the charge and the insert in one transaction."""
    task = get_task(state.db, env.task)
    try:
        bundle = state.bundles.get(task.bundle_id)
    except NotFound:
        raise Unavailable(f"the bundle {task.bundle_id[:12]}… of task {task.name!r} is not "
                          "available on this server") from None
    s = state.settings
    # the edge keeps at most the bundle's max_length word pieces (with [CLS]/[SEP] added)
    limits = Limits.for_bundle(bundle, labels=task.labels,
                               max_tokens=s.max_tokens_per_payload or bundle.max_length)
    recs = store.validate_records(task, env.records, limits)
    served = state.served_models.length_for_task(task.name, task.mechanism, task.params,
                                                 task.bundle_id)
    _check_as_predictions(task, bundle, recs, s.max_tokens_per_payload, served)
    charge = charging.charge_of(s, key_id, device_id, charging.records_cost(task, recs, bundle))
    return store.add_records(state.db, task, recs, key_id, idem,
                             store.body_digest(env) if idem is not None else None,
                             charge=charge)


@router.post(
    "/records", response_model=None, status_code=201, summary="Store labelled records",
    responses={201: {"model": RecordsResponse, "headers": {"Idempotent-Replayed": {
        "description": "true when an earlier request with this Idempotency-Key stored them",
        "schema": {"type": "string"}}}},
        **responses(401, 403, 404, 413, 422, 429, 503, 507)},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/RecordsRequest"}}}}})
async def post_records(
        request: Request, caller: AppCaller,
        idempotency_key: Annotated[str | None, Header(
            description="a retry with the same key and body gets the same ids and stores "
            "nothing new; the same key with another body is a 422",
            max_length=store.IDEMPOTENCY_KEY_MAX)] = None) -> Response:
    database(request)
    store.check_idempotency_key(idempotency_key)
    env = store.parse_body(await request.body())
    limit = request.app.state.settings.max_payloads_per_request
    if len(env.records) > limit:
        raise TooManyPayloads(f"{len(env.records)} records in one request; at most {limit} "
                              "(send several requests)")
    device = budgets.check_device_id(request.headers.get("x-device-id"))
    try:
        stored = await run_in_threadpool(_store, request.app.state, env, caller.key_id,
                                         device, idempotency_key)
    except budgets.BudgetExhausted:
        BUDGET_EXHAUSTED.labels(route="records").inc()
        raise
    if stored.replayed:
        return json_response({"ids": stored.ids}, 201, {"Idempotent-Replayed": "true"})
    RECORDS.labels(task=env.task).inc(len(stored.ids))
    charged = stored.charged
    assert charged is not None  # a stored request was charged (a replay is not)
    charging.counted(charged.cost, "records")
    return json_response({"ids": stored.ids}, 201, charged.headers())


@router.get("/tasks/{task}", response_model=TaskInfo, summary="What a task accepts",
            responses=responses(401, 403, 404, 422, 429, 503))
async def task_info(task: TaskPath, request: Request, caller: AppCaller) -> Response:
    t = await run_in_threadpool(get_task, database(request), task)
    return json_response(t.public())


async def start_store(app, stack) -> None:
    """Lifespan step: ``app.state.db`` for the settings, migrated at start for SQLite (for
    PostgreSQL only with PRIVBERT_DB_AUTO_UPGRADE=1; otherwise checked to be at head, and
    the server refuses to start if it is behind); its connections closed at shutdown. A
    database that cannot be reached at start is logged; record routes answer 503 until it
    can, and so do predictions (each one is charged to its key's privacy budget ledger)."""
    db = Database.from_settings(app.state.settings)
    stack.callback(db.dispose)
    await run_in_threadpool(db.prepare)
    app.state.db = db

    app.state.home.seals = DatabaseSeals(db)  # the sealed manifests' digests (issue 42)
