"""``GET /v1/models``, ``POST /v1/models/{model_id}/predict``, ``GET /v1/bundles/{bundle_id}``.

The predict body is validated here, by hand, because its payload limits depend on the
model (``registry.limits_for``): the count of payloads first (413 above
``max_payloads_per_request``, before any payload is decoded), then each payload against the
model's bundle (vocabulary, dimension, tokens). The registry checks mechanism, parameters
and bundle id and answers 422 naming the difference.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from cloud_api.auth import AppCaller
from cloud_api.charging import charge_prediction
from cloud_api.errors import ServiceError
from cloud_api.problems import responses
from cloud_api.routes.common import ModelId, json_response
from shared.payload import Payload

router = APIRouter(prefix="/v1", tags=["inference"])

BundleId = Annotated[str, Path(description="bundle id: 64 hex digits",
                               pattern=r"^[0-9a-f]{64}$")]


class TooManyPayloads(ServiceError):
    status, kind, title = 413, "too-many-payloads", "Too many payloads in one request"


class PredictRequest(BaseModel):
    """Privatized payloads (``shared.payload``), at most ``max_payloads_per_request``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    payloads: list[Payload] = Field(min_length=1, description="payloads made with the "
                                    "model's mechanism, parameters and bundle")

    @model_validator(mode="before")
    @classmethod
    def _count_first(cls, data: Any, info: ValidationInfo) -> Any:
        limit = (info.context or {}).get("max_payloads")
        items = data.get("payloads") if isinstance(data, dict) else None
        if limit is not None and isinstance(items, list) and len(items) > limit:
            raise TooManyPayloads(f"{len(items)} payloads in one request; at most {limit} "
                                  "(send several requests)")
        return data


class Prediction(BaseModel):
    label: str = Field(description="the most probable label")
    scores: dict[str, float] = Field(description="label -> probability")


class PredictResponse(BaseModel):
    model_id: str
    version: str = Field(description="the model version that answered")
    predictions: list[Prediction] = Field(description="one per payload, in order")


class ModelInfo(BaseModel):
    """A served model (``GET /v1/models``); more fields may follow."""

    model_config = ConfigDict(extra="allow")
    id: str
    version: str | None = Field(None, description="the promoted version")
    task: str | None = None
    labels: list[str]
    mechanism: str
    params: dict[str, Any]
    bundle_id: str
    max_length: int | None = None
    guarantee: dict[str, Any] | None = Field(None, description="published and what holds "
                                             "(shared.accounting)")
    metrics: dict[str, Any] | None = Field(None, description="dev metrics of the version")


class ModelList(BaseModel):
    models: list[ModelInfo]


@router.get("/models", response_model=None, summary="Served models",
            responses={200: {"model": ModelList}, **responses(401, 403, 429)})
async def list_models(request: Request, caller: AppCaller) -> Response:
    return json_response({"models": request.app.state.registry.describe()})


@router.post(
    "/models/{model_id}/predict", response_model=None, summary="Predict from payloads",
    responses={200: {"model": PredictResponse},
               **responses(401, 403, 404, 413, 422, 429, 500, 503)},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/PredictRequest"}}}}})
async def predict(model_id: ModelId, request: Request, caller: AppCaller) -> Response:
    registry = request.app.state.registry
    limits = registry.limits_for(model_id)  # NotFound for an unknown model
    body = await request.body()  # at most max_body_bytes (the middleware stops the read)
    settings = request.app.state.settings
    parsed = PredictRequest.model_validate_json(body, context={
        "limits": limits, "max_payloads": settings.max_payloads_per_request})
    charged = await charge_prediction(request.app.state, caller.key_id,  # 403 over the cap
                                      request.headers.get("x-device-id"), model_id,
                                      parsed.payloads)
    pred = await registry.predict(model_id, parsed.payloads,
                                  is_disconnected=request.is_disconnected)
    labels = list(pred.labels)
    best = pred.probs.argmax(axis=1).tolist()
    out = [{"label": labels[b], "scores": dict(zip(labels, row, strict=True))}
           for b, row in zip(best, pred.probs.tolist(), strict=True)]
    return json_response({"model_id": pred.model_id, "version": pred.version, "predictions": out},
                         headers=charged.headers())


@router.get(
    "/bundles/{bundle_id}", response_model=None, summary="The edge bundle as a tarball",
    responses={200: {"content": {"application/x-tar": {"schema": {"type": "string",
                                                                    "format": "binary"}}},
                     "description": "bundle tarball; ETag = bundle id"},
               304: {"description": "If-None-Match matched the bundle id"},
               **responses(401, 403, 404, 422, 429, 503)})
async def get_bundle(bundle_id: BundleId, request: Request, caller: AppCaller,
                     if_none_match: Annotated[str | None, Header()] = None) -> Response:
    bundles = request.app.state.bundles
    await run_in_threadpool(bundles.get, bundle_id)  # NotFound before any 304
    etag = f'"{bundle_id}"'
    headers = {"ETag": etag, "Cache-Control": "private, max-age=31536000, immutable"}
    if if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    data = await run_in_threadpool(bundles.tarball, bundle_id)
    return Response(data, media_type="application/x-tar", headers=headers)


def _matches(header: str, etag: str) -> bool:
    tags = [t.strip() for t in header.split(",")]
    return any(t == "*" or t.removeprefix("W/") == etag for t in tags)
