"""``POST /v1/models/{model_id}/predict``: one route, :class:`PredictRoute`.

The hot path of the service, so a plain Starlette route with a plain ASGI handler rather than
a FastAPI route: FastAPI's request parsing and dependency solving cost more CPU than the rest
of a request together (``bench/predict_cpu.py``). It is an ordinary member of the app's
router (first in it, :func:`install`), inside the same middleware stack as every route: the
service middleware (request id, body limit, concurrency, metrics by route template, access
log) and the app's exception handlers, which turn what the handler raises
(:class:`~cloud_api.errors.ServiceError`, pydantic's ``ValidationError``,
``RequestValidationError``) into the same problem+json answers as elsewhere. Being a plain
route, it takes no FastAPI dependency: a check belongs in :func:`predict_app` (or in a
Starlette ``middleware=`` of the route), and :func:`install` refuses an app with app-wide
dependencies, which would not run here.

The checks, in order: the key and its rate limit (:func:`cloud_api.auth.authenticate`), the
model id (422, as a FastAPI path parameter would answer), the model (404, before the body is
read), the body (the service middleware stops the read past ``max_body_bytes``), the payload
count (413 above ``max_payloads_per_request``, before any payload is decoded), each payload
(``shared.payload``, the model's limits), the model's contract (mechanism, parameters,
bundle: 422), then the privacy budget (:mod:`cloud_api.charging`): admitted to the model's
queue first (413 or 429 there, nothing charged), charged while the model runs, committed
before any answer, refunded when no answer comes.

A client that goes away is noticed through ASGI itself: once the body is read, the next
message on ``receive`` is ``http.disconnect``; once the request is queued, a task waits for
it (:class:`Disconnect`), so the batcher drops a queued request whose client left, and its
charge is refunded. A request the idle batcher runs inline never waits: no task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from enum import Enum
from typing import Any

import orjson
from fastapi.exceptions import RequestValidationError
from fastapi.utils import generate_unique_id
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from cloud_api.auth import authenticate
from cloud_api.charging import price_prediction, settle_prediction, unanswered
from cloud_api.errors import TooManyPayloads
from cloud_api.problems import add_schemas, responses
from cloud_api.routes.common import ModelId, header
from shared.payload import Payload

PATH = "/v1/models/{model_id}/predict"
TAGS: list[str | Enum] = ["inference"]
_MODEL_ID = TypeAdapter(ModelId)


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


# -- the handler -----------------------------------------------------------------------------
async def predict_app(scope: Scope, receive: Receive, send: Send) -> None:
    """The route's ASGI app (see the module docstring); errors are raised for the app's
    exception handlers."""
    app_state = scope["app"].state
    caller = await authenticate(app_state, header(scope, b"authorization"), "app",
                                scope.setdefault("state", {}))
    model_id = _model_id(scope["path_params"]["model_id"])
    app_state.served_models.limits_for(model_id)  # NotFound, before the body is read
    body = await _body(receive)
    gone = Disconnect(receive)
    try:
        answer, headers = await _predict(app_state, caller.key_id,
                                         header(scope, b"x-device-id"), model_id, body, gone)
        data = orjson.dumps(answer)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode("ascii")),
            *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())]})
        await send({"type": "http.response.body", "body": data})
    finally:
        gone.stop()


async def _predict(app_state, key_id: str, device_id: str | None, model_id: str, body: bytes,
                   is_disconnected) -> tuple[dict, dict[str, str]]:
    """The answer to a predict body and its budget headers, once the caller's ledger is
    charged (ServiceError, or pydantic's ValidationError)."""
    served_models = app_state.served_models
    parsed = PredictRequest.model_validate_json(body, context={
        "limits": served_models.limits_for(model_id),
        "max_payloads": app_state.settings.max_payloads_per_request})
    # Admitted to the model's queue first (413 or 429 here: nothing charged), then the
    # charge commits on the charge writer's thread while the model runs; the answer waits
    # for both, and a refused charge (403) throws the forward's result away: nothing over
    # the cap is answered, and a lone request does not wait for a flush and then for the
    # model. No answer (the client went away, the forward failed, the queue timed out): the
    # committed charge is refunded (cloud_api.charging).
    ch, checked = await price_prediction(app_state, key_id, device_id, model_id,
                                         parsed.payloads)
    answer = served_models.admit(model_id, parsed.payloads, is_disconnected=is_disconnected,
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


def _model_id(value: str) -> str:
    """The path's model id, checked as FastAPI checks a ``ModelId`` path parameter (the same
    422 answer and error list)."""
    try:
        return _MODEL_ID.validate_python(value)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("path", "model_id", *e["loc"])}
                                      for e in exc.errors(include_url=False)]) from None


async def _body(receive: Receive) -> bytes:
    """The whole request body (as Starlette's ``Request.body``: ClientDisconnect when the
    client goes away while it is read)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


class Disconnect:
    """Whether the client has gone away, for the batcher (a cheap flag read): after the whole
    body, the next ASGI message on ``receive`` is ``http.disconnect``, sent when the client
    closes the connection, or once the response is complete (ASGI's HTTP spec); a task
    waits for it from :meth:`watch`, which the batcher's queue calls when the request is
    queued."""

    __slots__ = ("gone", "_receive", "_task")

    def __init__(self, receive: Receive):
        self.gone = False
        self._receive = receive
        self._task: asyncio.Task | None = None

    def watch(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(self._receive))

    async def _watch(self, receive: Receive) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # noqa: BLE001 - a server's receive failing says nothing of the client
            return
        self.gone = True

    def __call__(self) -> bool:
        return self.gone

    def stop(self) -> None:
        """Once the response is sent: the server's ``http.disconnect`` ends the task (no
        cancellation, whose exception and reference cycle cost a request more); a task
        still waiting on the loop's next turn is cancelled."""
        if self._task is not None:
            asyncio.get_running_loop().call_soon(_cancel_if_waiting, self._task)


def _cancel_if_waiting(task: asyncio.Task) -> None:
    if not task.done():
        task.cancel()


# -- the route -------------------------------------------------------------------------------
class PredictRoute(Route):
    """The one route of predict: a Starlette route whose endpoint is :func:`predict_app`
    (``middleware``, Starlette's, wraps it), documented in OpenAPI by :meth:`document`."""

    def __init__(self, middleware: Sequence[Middleware] | None = None):
        super().__init__(PATH, _Asgi(), methods=["POST"], name="predict",
                         middleware=middleware)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """Starlette's match, and the route in the child scope (as FastAPI's routes put it:
        the service middleware labels metrics and logs with its path template)."""
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child

    def document(self, openapi: dict) -> None:
        """Put the operation into ``openapi`` as FastAPI documents a route (operation id,
        path parameter, responses), after ``GET /v1/models``, with the request and response
        schemas generated from :class:`PredictRequest` and :class:`PredictResponse`."""
        param = _MODEL_ID.json_schema()
        operation = {
            "tags": TAGS, "summary": "Predict from payloads",
            "operationId": generate_unique_id(self),  # type: ignore[arg-type]
            "parameters": [{"name": "model_id", "in": "path", "required": True,
                            "schema": {**param, "title": "Model Id"},
                            "description": param["description"]}],
            "responses": {"200": {"description": "Successful Response", "content": {
                "application/json": {"schema": _ref(PredictResponse)}}},
                **{str(s): r for s, r in responses(401, 403, 404, 413, 422, 429, 500, 503,
                                                   507).items()}},
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": _ref(PredictRequest)}}}}
        add_schemas(openapi, PredictRequest, PredictResponse)
        paths = openapi.setdefault("paths", {})
        items = list(paths.items())
        at = next((i + 1 for i, (p, _) in enumerate(items) if p == "/v1/models"), len(items))
        items.insert(at, (self.path, {"post": operation}))
        paths.clear()
        paths.update(items)


class _Asgi:
    """:func:`predict_app` as an object: Starlette runs a non-function endpoint as an ASGI
    app, as it is (a function would be wrapped as a request-response endpoint)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await predict_app(scope, receive, send)


def _ref(model: type[BaseModel]) -> dict:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def install(app) -> PredictRoute:
    """Put the predict route first in ``app``'s router (one regular expression tried before
    it answers); ValueError when the app has app-wide FastAPI dependencies (they run for
    FastAPI routes only)."""
    if app.router.dependencies:
        raise ValueError("app-wide FastAPI dependencies would not run for predict (a plain "
                         "Starlette route): put the check in cloud_api.routes.predict")
    route = PredictRoute()
    app.router.routes.insert(0, route)
    return route
