"""``GET /v1/models``, ``POST /v1/models/{model_id}/predict``, ``GET /v1/bundles/{bundle_id}``.

The predict body is validated here, by hand, because its payload limits depend on the
model (``registry.limits_for``): the count of payloads first (413 above
``max_payloads_per_request``, before any payload is decoded), then each payload against the
model's bundle (vocabulary, dimension, tokens). The registry checks mechanism, parameters
and bundle id and answers 422 naming the difference.

Predict is the hot path: :func:`predict_route` hands ``POST /v1/models/{id}/predict`` (a
valid id) to :func:`predict_asgi` straight from the service middleware, past FastAPI's
router, dependency solving and exception middlewares, which cost more CPU than the rest of
a request together (``bench/serve.py`` measures it). It runs the same checks in the
same order as the FastAPI route declared below (which documents it in OpenAPI and serves
it where the middleware is not installed): the key and its rate limit
(:func:`cloud_api.auth.authenticate`), the model (404), the body (size limit enforced by the
middleware while it is read), the payload count, each payload, the model's contract, the
caller's privacy budget (admitted to the model's queue first, then charged while the model
runs, committed before any answer, refunded when no answer comes: :mod:`cloud_api.charging`);
its errors are the same problem+json answers.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Path, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from cloud_api.auth import AppCaller, authenticate
from cloud_api.charging import price_prediction, settle_prediction, unanswered
from cloud_api.errors import ServiceError, TooManyPayloads
from cloud_api.home import ID_PATTERN
from cloud_api.problems import responses, service_error_response, validation_response
from cloud_api.routes.common import ModelId, json_response
from shared.payload import Payload

router = APIRouter(prefix="/v1", tags=["inference"])

BundleId = Annotated[str, Path(description="bundle id: 64 hex digits",
                               pattern=r"^[0-9a-f]{64}$")]


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
               **responses(401, 403, 404, 413, 422, 429, 500, 503, 507)},
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/PredictRequest"}}}}})
async def predict(model_id: ModelId, request: Request, caller: AppCaller) -> Response:
    registry = request.app.state.registry
    registry.limits_for(model_id)  # NotFound for an unknown model, before the body is read
    body = await request.body()  # at most max_body_bytes (the middleware stops the read)
    answer, headers = await _predict(request.app.state, caller.key_id,
                                     request.headers.get("x-device-id"), model_id, body,
                                     request.is_disconnected)
    return json_response(answer, headers=headers)


async def _predict(app_state, key_id: str, device_id: str | None, model_id: str, body: bytes,
                   is_disconnected) -> tuple[dict, dict[str, str]]:
    """The answer to a predict body and its budget headers, once the caller's ledger is
    charged (ServiceError, or pydantic's ValidationError)."""
    registry = app_state.registry
    parsed = PredictRequest.model_validate_json(body, context={
        "limits": registry.limits_for(model_id),
        "max_payloads": app_state.settings.max_payloads_per_request})
    # Admitted to the model's queue first (413 or 429 here: nothing charged), then the
    # charge commits on the charge writer's thread while the model runs; the answer waits
    # for both, and a refused charge (403) throws the forward's result away: nothing over
    # the cap is answered, and a lone request does not wait for a flush and then for the
    # model (bench/serve.py). No answer (the client went away, the forward failed, the
    # queue timed out): the committed charge is refunded (cloud_api.charging).
    ch, checked = await price_prediction(app_state, key_id, device_id, model_id,
                                         parsed.payloads)
    answer = registry.admit(model_id, parsed.payloads, is_disconnected=is_disconnected,
                            checked=checked)
    pending = app_state.charges.submit(ch)
    pending.add_done_callback(_retrieved)
    try:
        pred = await answer()
    except BaseException as exc:
        await unanswered(app_state.charges, pending, ch, exc)  # 403 if over the cap
        raise
    charged = await settle_prediction(pending, ch.cost)
    labels = list(pred.labels)
    best = pred.probs.argmax(axis=1).tolist()
    out = [{"label": labels[b], "scores": dict(zip(labels, row, strict=True))}
           for b, row in zip(best, pred.probs.tolist(), strict=True)]
    return ({"model_id": pred.model_id, "version": pred.version, "predictions": out},
            charged.headers())


def _retrieved(fut) -> None:
    """Marks a charge's outcome as seen when its request went away before awaiting it."""
    if not fut.cancelled():
        fut.exception()


# -- the fast path ---------------------------------------------------------------------------
_PREDICT_PATH = re.compile(r"^/v1/models/(" + ID_PATTERN.strip("^$") + r")/predict$")
_PREDICT_ROUTE = SimpleNamespace(path="/v1/models/{model_id}/predict")  # route_template


def predict_route(scope: Scope) -> ASGIApp | None:
    """:func:`predict_asgi` for ``POST /v1/models/{model_id}/predict`` with a valid id; None
    for anything else (FastAPI answers it: other routes, methods, malformed ids)."""
    if scope.get("method") != "POST":
        return None
    m = _PREDICT_PATH.match(scope.get("path", ""))
    if m is None:
        return None
    scope["path_params"] = {"model_id": m.group(1)}
    scope["route"] = _PREDICT_ROUTE
    return predict_asgi


async def predict_asgi(scope: Scope, receive: Receive, send: Send) -> None:
    """Predict as a plain ASGI app (see the module docstring)."""
    app_state = scope["app"].state
    state = scope.setdefault("state", {})
    rid = state.get("request_id")
    model_id = scope["path_params"]["model_id"]
    try:
        caller = authenticate(app_state, _header(scope, b"authorization"), "app", state)
        app_state.registry.limits_for(model_id)  # NotFound, before the body is read
        body = await _body(receive)
        answer, extra = await _predict(app_state, caller.key_id,
                                       _header(scope, b"x-device-id"), model_id, body,
                                       _disconnect_check(scope, receive))
        data = orjson.dumps(answer)
    except ServiceError as exc:
        await service_error_response(rid, state, exc)(scope, receive, send)
        return
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False)
        await validation_response(rid, state, errors)(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode("ascii")),
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items())]})
    await send({"type": "http.response.body", "body": data})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


async def _body(receive: Receive) -> bytes:
    """The whole request body (Starlette's ``Request.body``: ClientDisconnect when the
    client goes away while it is read)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _disconnect_check(scope: Scope, receive: Receive):
    """A cheap ``is_disconnected`` for the batcher: uvicorn's request cycle (the bound
    ``receive``, under the middleware's wrapper: its ``inner``) keeps a ``disconnected``
    flag; other servers get Starlette's check."""
    cycle = getattr(getattr(receive, "inner", receive), "__self__", None)
    if isinstance(getattr(cycle, "disconnected", None), bool):
        return lambda: cycle.disconnected
    return Request(scope, receive).is_disconnected


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
