"""``POST /admin/tasks``, ``GET /admin/tasks``, ``DELETE /admin/records``.

A task declaration says what its records must be; declaring the same again is a no-op
(200), a different declaration for an existing task a 409 naming the difference.
Deletion takes its selectors (task, ids, key_id; combined with AND) from a JSON body or
from the query string, not both; deleting by ``key_id`` alone is the erasure of
everything a key sent.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from cloud_api.auth import AdminCaller
from cloud_api.errors import InvalidRequest, NotFound
from cloud_api.problems import responses
from cloud_api.routes.common import database, json_response
from cloud_api.routes.records import TaskInfo
from cloud_api.store import records as store
from cloud_api.store import tasks
from shared.mechanisms import registry

router = APIRouter(prefix="/admin", tags=["admin"])


class TaskSummary(TaskInfo):
    created_at: str | None
    records: int = Field(description="records stored")
    counts: dict[str, int] = Field(description="records per class name")
    soft: int = Field(description="records with a soft (mixed TextHide) label")


class TaskList(BaseModel):
    tasks: list[TaskSummary]


class Deleted(BaseModel):
    deleted: int = Field(description="records deleted")


def _declare(state, decl: tasks.TaskDeclaration) -> tuple[tasks.Task, bool]:
    if not registry.get(decl.mechanism).private and not state.settings.allow_none:
        raise InvalidRequest(f"mechanism '{decl.mechanism}' (no privatization) is refused "
                             "unless the server allows it (PRIVBERT_ALLOW_NONE)")
    try:
        bundle = state.bundles.get(decl.bundle_id)
    except NotFound:
        raise InvalidRequest(f"bundle {decl.bundle_id[:12]}… is not known to this server: "
                             "add it to $PRIVBERT_HOME/bundles first (cloud-api "
                             "export-bundle, or register a model trained with it)") from None
    tasks.privacy_floor_refusal(decl.mechanism, decl.params, bundle,
                                state.settings.allow_weak_privacy)
    return tasks.ensure_task(state.db, decl.task, decl.labels, decl.mechanism, decl.params,
                             decl.bundle_id, decl.pairs)


@router.post("/tasks", response_model=None, status_code=201, summary="Declare a task",
             responses={201: {"model": TaskInfo, "description": "declared now"},
                        200: {"model": TaskInfo, "description": "the same declaration "
                              "already existed"},
                        **responses(401, 403, 409, 413, 422, 429, 503)},
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {
                     "$ref": "#/components/schemas/TaskDeclaration"}}}}})
async def declare_task(request: Request, caller: AdminCaller) -> Response:
    database(request)
    decl = tasks.TaskDeclaration.model_validate_json(await request.body())
    task, created = await run_in_threadpool(_declare, request.app.state, decl)
    return json_response(task.public(), 201 if created else 200)


@router.get("/tasks", response_model=TaskList, summary="Tasks with record counts per label",
            responses=responses(401, 403, 429, 503))
async def list_tasks(request: Request, caller: AdminCaller) -> Response:
    return json_response({"tasks": await run_in_threadpool(tasks.list_tasks, database(request))})


@router.delete(
    "/records", response_model=Deleted, summary="Delete records (by task, ids or key id)",
    responses=responses(401, 403, 404, 413, 422, 429, 503),
    openapi_extra={"requestBody": {"required": False, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/DeleteRecords"}}}}})
async def delete_records(
        request: Request, caller: AdminCaller,
        task: Annotated[str | None, Query(description="records of this task")] = None,
        ids: Annotated[list[int] | None, Query(description="these record ids")] = None,
        key_id: Annotated[str | None, Query(description="records sent by this key id "
                                            "(erasure)")] = None) -> Response:
    db = database(request)
    body = await request.body()
    from_query = task is not None or ids is not None or key_id is not None
    if body.strip():
        if from_query:
            raise InvalidRequest("give the selectors in the JSON body or in the query "
                                 "string, not both")
        sel = store.DeleteRecords.model_validate_json(body)
    else:
        sel = store.DeleteRecords.model_validate({"task": task, "ids": ids, "key_id": key_id})
    n = await run_in_threadpool(lambda: store.delete_records(db, task=sel.task, ids=sel.ids,
                                                             key_id=sel.key_id))
    return json_response({"deleted": n})
