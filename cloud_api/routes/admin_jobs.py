"""Jobs: ``POST /admin/retrain``, ``POST /admin/pretrain``, ``GET /admin/jobs``,
``GET /admin/jobs/{job_id}``, ``POST /admin/jobs/{job_id}/cancel``.

Submitting only checks the request (``cloud_api.jobs.specs``: unknown task 404, too few
records per label, a base of another bundle or mechanism, bad epochs or learning rate:
422) and inserts a job row: 202 ``{"job_id"}`` with ``Location: /admin/jobs/{id}``. A
worker (``cloud-api worker``, or the thread inside ``cloud-api serve``) does the rest.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from cloud_api.auth import AdminCaller
from cloud_api.jobs import queue
from cloud_api.jobs.requests import PretrainRequest, RetrainRequest
from cloud_api.jobs.specs import check_retrain, submit_pretrain
from cloud_api.jobs.states import JobKind
from cloud_api.jobs.supervisor import Worker
from cloud_api.problems import responses
from cloud_api.routes.common import database, json_response

router = APIRouter(prefix="/admin", tags=["admin: jobs"])

JobId = Annotated[int, Path(description="job id", ge=1, le=2**63 - 1)]
State = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class JobAccepted(BaseModel):
    job_id: int
    state: State = "queued"


class JobOut(BaseModel):
    """A job as ``GET /admin/jobs/{job_id}`` shows it."""

    job_id: int
    kind: Literal["retrain", "pretrain"]
    state: State
    spec: dict[str, Any] = Field(description="the checked request")
    attempts: int
    max_attempts: int
    worker_id: str | None = Field(description="the worker running it (host:pid:tag)")
    created_by: str | None = Field(description="key id of the admin who submitted it")
    progress: dict[str, Any] | None = Field(description="phase, step, total, epoch, loss, "
                                            "dev_accuracy")
    error: str | None = Field(description="why it failed, was cancelled or was queued again")
    log_tail: str | None = Field(description="the last lines of the job's log")
    result: dict[str, Any] | None = Field(description="version, metrics, promotion decision")
    cancel_requested: bool
    watermark: int | None = Field(description="highest record id of the training snapshot")
    version: str | None = Field(description="the model version it registered")
    base: str | None = Field(description="the base a pretraining job registered")
    created_at: str | None
    started_at: str | None
    claimed_at: str | None
    heartbeat_at: str | None
    finished_at: str | None


class JobList(BaseModel):
    jobs: list[JobOut]


def _body_schema(model: type[BaseModel]) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def _accepted(request: Request, job_id: int) -> Response:
    worker = getattr(request.app.state, "worker", None)
    if worker is not None:
        worker.wake()  # the thread in this process claims it now, not at its next poll
    return json_response({"job_id": job_id, "state": "queued"}, 202,
                 {"Location": f"/admin/jobs/{job_id}"})


@router.post("/retrain", status_code=202, response_model=JobAccepted,
             summary="Queue a retraining job on a task's records",
             responses=responses(401, 403, 404, 413, 422, 429, 503),
             openapi_extra=_body_schema(RetrainRequest))
async def post_retrain(request: Request, caller: AdminCaller) -> Response:
    req = RetrainRequest.model_validate_json(await request.body())  # after the key check
    state, db = request.app.state, database(request)

    def submit() -> int:
        spec = check_retrain(db, state.home, state.bundles, state.settings, req)
        return queue.enqueue(db, JobKind.RETRAIN, spec, max_attempts=state.settings.max_attempts,
                             created_by=caller.key_id)

    return _accepted(request, await asyncio.to_thread(submit))


@router.post("/pretrain", status_code=202, response_model=JobAccepted,
             summary="Queue a privacy-adaptive pretraining job on the public corpus",
             responses=responses(401, 403, 409, 413, 422, 429, 503),
             openapi_extra=_body_schema(PretrainRequest))
async def post_pretrain(request: Request, caller: AdminCaller) -> Response:
    req = PretrainRequest.model_validate_json(await request.body())
    state, db = request.app.state, database(request)

    def submit() -> int:
        return submit_pretrain(db, state.home, state.settings, req, created_by=caller.key_id)

    return _accepted(request, await asyncio.to_thread(submit))


@router.get("/jobs", response_model=JobList, summary="Jobs, newest first",
            responses=responses(401, 403, 422, 429, 503))
async def list_jobs(request: Request, caller: AdminCaller,
                    state: Annotated[list[State] | None, Query(
                        description="only these states (repeat the parameter)")] = None,
                    kind: Annotated[Literal["retrain", "pretrain"] | None, Query()] = None,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                    before: Annotated[int | None, Query(ge=1, le=2**63 - 1, description=
                                                        "only ids below this (paging)")] = None
                    ) -> Response:
    found = await asyncio.to_thread(queue.list_jobs, database(request),
                                    states=tuple(state) if state else None, kind=kind,
                                    limit=limit, before_id=before)
    return json_response({"jobs": [j.public() for j in found]})


@router.get("/jobs/{job_id}", response_model=JobOut, summary="One job: state, progress, "
            "heartbeat, attempts, error, log tail, the version it produced",
            responses=responses(401, 403, 404, 422, 429, 503))
async def get_job(job_id: JobId, request: Request, caller: AdminCaller) -> Response:
    job = await asyncio.to_thread(queue.get, database(request), job_id)
    return json_response(job.public())


@router.post("/jobs/{job_id}/cancel", status_code=202, response_model=JobOut,
             summary="Cancel a job (a running one stops at its next training step; no "
             "version is registered)", responses=responses(401, 403, 404, 409, 429, 503))
async def cancel_job(job_id: JobId, request: Request, caller: AdminCaller) -> Response:
    job = await asyncio.to_thread(queue.request_cancel, database(request), job_id)
    return json_response(job.public(), 202)


async def start_worker(app, stack) -> None:
    """Lifespan step: one job worker thread in this process when ``worker_in_serve``
    (after the store step, which sets ``app.state.db``)."""
    s = app.state.settings
    app.state.worker = None
    if not s.worker_in_serve or getattr(app.state, "db", None) is None:
        return

    worker = Worker(s, app.state.db, app.state.home)
    worker.start()
    app.state.worker = worker

    async def stop() -> None:  # the running job's child is stopped and the job re-queued
        await asyncio.to_thread(worker.stop, 30.0)

    stack.push_async_callback(stop)
