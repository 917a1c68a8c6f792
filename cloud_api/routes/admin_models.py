"""``POST /admin/models/{model_id}/promote {"version"}``: serve another registered version.

The server loads the version beside the one serving, switches new requests to it, lets
queued requests finish on the old one, then releases it; a version that fails to load
leaves the old one serving and answers the error."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from cloud_api.auth import AdminCaller
from cloud_api.home import VERSION_PATTERN
from cloud_api.problems import responses
from cloud_api.routes.common import ModelId

router = APIRouter(prefix="/admin", tags=["admin"])


class PromoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str = Field(pattern=VERSION_PATTERN, description="a registered version, "
                         "e.g. v2", examples=["v2"])


class PromoteResponse(BaseModel):
    model_id: str
    version: str = Field(description="the version now serving")


@router.post("/models/{model_id}/promote", response_model=PromoteResponse,
             summary="Promote a registered version (hot swap, no restart)",
             responses=responses(401, 403, 404, 413, 422, 429, 503),
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {
                     "$ref": "#/components/schemas/PromoteRequest"}}}}})
async def promote(model_id: ModelId, request: Request,
                  caller: AdminCaller) -> PromoteResponse:
    # the body is read after the key is checked (a body parameter would be read first)
    body = PromoteRequest.model_validate_json(await request.body())
    await request.app.state.served_models.promote(model_id, body.version)
    return PromoteResponse(model_id=model_id, version=body.version)
