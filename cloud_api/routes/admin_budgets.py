"""``GET /admin/budgets``, ``GET|PUT /admin/budgets/{key_id}``,
``POST /admin/budgets/{key_id}/reset``: the privacy budget ledgers (``store/budget_admin.py``).

A key's view: its own ledger (everything the key sent, under the key's cap), the ledger of
each of its devices (its own spend, its own cap if it has one, and what it may still spend:
the least of its own remaining and the key's), and the total; spent, cap and remaining in
worst-case epsilon, per family too. ``PUT /admin/budgets/{key_id}/devices/{device_id}`` sets
a device's own cap (never above its key's).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from cloud_api.auth import AdminCaller
from cloud_api.problems import responses
from cloud_api.routes.common import database, json_response
from cloud_api.store import budget_admin, budgets
from cloud_api.store.charge_writer import ChargeWriter

router = APIRouter(prefix="/admin", tags=["admin"])
KeyIdPath = Annotated[str, Path(description="the key's short id (as stored with its records)",
                                pattern=budgets.ID_PATTERN)]


class CapRequest(BaseModel):
    """The cap of a key's ledgers in worst-case epsilon; null removes it (everything is
    still counted)."""

    model_config = ConfigDict(extra="forbid")
    cap: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] | None = Field(
        description="worst-case epsilon, or null for no cap")


def _known(request: Request) -> set[str]:
    return request.app.state.keys.key_ids()


def _default(request: Request) -> float | None:
    return request.app.state.settings.default_budget


@router.get("/budgets", summary="Privacy spent per key (and per device), caps, remaining",
            responses=responses(401, 403, 429, 503))
async def list_budgets(request: Request, caller: AdminCaller) -> Response:
    got = await run_in_threadpool(budget_admin.list_budgets, database(request), _known(request),
                                  _default(request))
    return json_response({"budgets": got})


@router.get("/budgets/{key_id}", summary="One key's privacy budget ledgers",
            responses=responses(401, 403, 404, 422, 429, 503))
async def get_budget(key_id: KeyIdPath, request: Request, caller: AdminCaller) -> Response:
    return json_response(await run_in_threadpool(
        budget_admin.get_budget, database(request), key_id, _known(request), _default(request)))


@router.put("/budgets/{key_id}", summary="Set or remove a key's cap",
            responses=responses(401, 403, 404, 413, 422, 429, 503),
            openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/CapRequest"}}}}})
async def set_cap(key_id: KeyIdPath, request: Request, caller: AdminCaller) -> Response:
    db = database(request)
    body = CapRequest.model_validate_json(await request.body())
    return json_response(await run_in_threadpool(
        budget_admin.set_cap, db, key_id, body.cap, _known(request), _default(request)))


DeviceIdPath = Annotated[str, Path(description="the device's X-Device-Id",
                                   pattern=budgets.ID_PATTERN)]


@router.put("/budgets/{key_id}/devices/{device_id}", summary="Set or remove a device's own cap",
            responses=responses(401, 403, 404, 413, 422, 429, 503),
            openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/CapRequest"}}}}})
async def set_device_cap(key_id: KeyIdPath, device_id: DeviceIdPath, request: Request,
                         caller: AdminCaller) -> Response:
    db = database(request)
    body = CapRequest.model_validate_json(await request.body())
    return json_response(await run_in_threadpool(
        budget_admin.set_device_cap, db, key_id, device_id, body.cap, _known(request),
        _default(request)))


@router.post("/budgets/{key_id}/reset", summary="Reset what a key's ledgers have spent",
             responses=responses(401, 403, 404, 422, 429, 503))
async def reset(key_id: KeyIdPath, request: Request, caller: AdminCaller) -> Response:
    return json_response(await run_in_threadpool(
        budget_admin.reset, database(request), key_id, _known(request), _default(request)))


async def start_charges(app, stack) -> None:
    """Lifespan step (after the store): the group-commit writer of prediction charges."""
    app.state.charges = ChargeWriter(app.state.db)
    stack.callback(app.state.charges.close)
