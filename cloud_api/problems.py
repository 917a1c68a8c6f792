"""Every error as ``application/problem+json`` (RFC 9457), with one stable ``type`` per kind.

    {"type": "urn:privbert:problem:payload-mismatch", "title": "Payload does not match the
     model", "status": 422, "detail": "eta 60 sent, model serves eta 65",
     "instance": "<request id>"}

Routes just raise: a :class:`~cloud_api.errors.ServiceError`, a pydantic ``ValidationError``
(from validating a body by hand), or anything FastAPI/Starlette raises (unknown route,
wrong method, a body that is not JSON, a bad path parameter). :func:`install` registers
the handlers; :func:`internal_error` is what the middleware answers for an unexpected
exception. A ``detail`` never echoes payload data: validation errors are listed with
``errors(include_input=False, include_url=False)`` and without their context objects.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from cloud_api.errors import ServiceError, problem_type

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"
_MAX_LOC_TEXT = 64  # a dict key chosen by the client is cut, never echoed at length

# status of a framework error -> (kind, title)
_HTTP_KINDS: dict[int, tuple[str, str]] = {
    400: ("bad-request", "Bad request"),
    401: ("unauthorized", "Missing or unknown API key"),
    403: ("forbidden", "This key may not use this endpoint"),
    404: ("not-found", "Not found"),
    405: ("method-not-allowed", "Method not allowed"),
    406: ("not-acceptable", "Not acceptable"),
    411: ("length-required", "Length required"),
    413: ("too-large", "Request body too large"),
    415: ("unsupported-media-type", "Unsupported media type"),
    422: ("validation", "Invalid request"),
    429: ("overloaded", "Too many requests"),
    500: ("internal", "Internal error"),
    503: ("unavailable", "Service unavailable"),
    507: ("insufficient-storage", "Insufficient storage"),
}


class ValidationIssue(BaseModel):
    """One validation error (pydantic's, without the input value)."""

    loc: list[str | int] = Field(description="where: body, payloads, 0, token_ids, ...")
    msg: str
    type: str = Field(description="pydantic error type, e.g. missing, extra_forbidden")


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str = Field(description="stable URI of the kind of error, "
                      "urn:privbert:problem:<kind>", examples=["urn:privbert:problem:validation"])
    title: str = Field(description="short summary of the kind of error")
    status: int = Field(description="the HTTP status code")
    detail: str = Field(description="what went wrong in this request (never payload data)")
    instance: str | None = Field(None, description="the request id (X-Request-ID)")
    errors: list[ValidationIssue] | None = Field(None, description="validation errors")
    remaining: float | None = Field(None, description="budget-exhausted: what the ledger "
                                    "has left under its cap (worst-case epsilon)")


class BodyTooLarge(HTTPException):
    """Raised while the body is read, as soon as it passes ``max_body_bytes`` (413).

    An ``HTTPException`` so that FastAPI's own body parsing lets it through unchanged."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body larger than {limit} bytes")


def problem_response(request_id: str | None, status: int, kind: str, title: str, detail: str,
                     *, errors: list[dict] | None = None, retry_after: float | None = None,
                     headers: dict[str, str] | None = None,
                     state: dict | None = None, extra: dict | None = None) -> Response:
    """A problem+json response; ``extra``: extension members (RFC 9457 §3.2); ``state``
    (the request's scope state) learns the kind, for the failure metrics and the access
    log."""
    body: dict[str, Any] = {"type": problem_type(kind), "title": title, "status": status,
                            "detail": detail, "instance": request_id}
    if errors is not None:
        body["errors"] = errors
    for k, v in (extra or {}).items():
        body.setdefault(k, v)
    hdrs = dict(headers or {})
    if retry_after is not None or status in (429, 503):
        hdrs["Retry-After"] = str(max(1, math.ceil(retry_after or 1)))
    if state is not None:
        state["problem_kind"] = kind
    return Response(orjson.dumps(body), status_code=status, media_type=MEDIA_TYPE,
                    headers=hdrs)


def internal_error(request_id: str | None, state: dict | None = None) -> Response:
    """The 500 answer to an unexpected exception (logged by the caller, never echoed)."""
    return problem_response(request_id, 500, "internal", "Internal error",
                            "an unexpected error occurred; quote the request id when "
                            "reporting it", state=state)


def clean_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic errors as JSON-safe issues: location, message, type; no input, no context."""
    out: list[dict[str, Any]] = []
    for e in errors:
        loc = [x if isinstance(x, int) else _cut(str(x)) for x in e.get("loc", ())]
        out.append({"loc": loc, "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    return out


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_LOC_TEXT else text[: _MAX_LOC_TEXT - 1] + "…"


def validation_problem(request: Request, errors: Sequence[Mapping[str, Any]],
                       where: str = "body") -> Response:
    return validation_response(_rid(request), _state(request), errors, where)


def validation_response(request_id: str | None, state: dict,
                        errors: Sequence[Mapping[str, Any]], where: str = "body") -> Response:
    """422 ``validation`` listing pydantic ``errors`` (without their input values)."""
    issues = clean_errors(errors)
    first = issues[0] if issues else {"loc": [], "msg": "invalid"}
    at = ".".join(str(x) for x in first["loc"]) or where
    more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
    return problem_response(request_id, 422, "validation", "Invalid request",
                            f"{at}: {first['msg']}{more}", errors=issues, state=state)


def service_error_response(request_id: str | None, state: dict, exc: ServiceError
                           ) -> Response:
    """The problem answer of a :class:`ServiceError` (401 adds ``WWW-Authenticate``)."""
    errors = clean_errors(exc.errors) if exc.errors else None
    headers = dict(exc.headers or {})
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return problem_response(request_id, exc.status, exc.kind, exc.title, exc.detail,
                            errors=errors, retry_after=exc.retry_after, headers=headers,
                            state=state, extra=exc.extra)


def _rid(request: Request) -> str | None:
    return request.scope.get("state", {}).get("request_id")


def _state(request: Request) -> dict:
    return request.scope.setdefault("state", {})


# -- handlers --------------------------------------------------------------------------------
async def _service_error(request: Request, exc: ServiceError) -> Response:
    return service_error_response(_rid(request), _state(request), exc)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    kind, title = _HTTP_KINDS.get(exc.status_code, (f"http-{exc.status_code}", "Error"))
    detail = exc.detail if isinstance(exc.detail, str) else title
    if exc.status_code == 404 and detail == "Not Found":
        detail = "no such route: see /docs for the API"
    elif exc.status_code == 405:
        detail = f"method {request.method} is not allowed on this route"
    headers = dict(exc.headers or {})
    if exc.status_code == 413:
        headers["Connection"] = "close"  # the rest of the body is never read
    return problem_response(_rid(request), exc.status_code, kind, title, detail,
                            headers=headers, state=_state(request))


async def _request_validation_error(request: Request, exc: RequestValidationError) -> Response:
    errs = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errs):
        return problem_response(_rid(request), 422, "validation", "Invalid request",
                                "body is not valid JSON",
                                errors=clean_errors([e for e in errs
                                                     if e.get("type") == "json_invalid"]),
                                state=_state(request))
    return validation_problem(request, errs)


async def _validation_error(request: Request, exc: ValidationError) -> Response:
    return validation_problem(request, exc.errors(include_input=False, include_url=False))


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``: each takes its own exception class (Starlette types
    a handler as taking any exception)."""
    handlers: list[tuple[type[Exception], Callable[[Request, Any], Awaitable[Response]]]] = [
        (ServiceError, _service_error), (HTTPException, _http_error),
        (RequestValidationError, _request_validation_error),
        (ValidationError, _validation_error)]
    for cls, handler in handlers:
        app.add_exception_handler(cls, handler)


# -- OpenAPI ---------------------------------------------------------------------------------
_DESCRIPTIONS = {
    400: "Bad request", 401: "Missing or unknown API key", 403: "Key not allowed here",
    404: "Not found", 409: "Conflict", 413: "Body or payload count over the limit",
    422: "Invalid request (validation, payload does not match the model)",
    429: "Too many requests (queue full, concurrency limit, rate limit); see Retry-After",
    500: "Unexpected error or inference failure", 503: "Not ready, queue timeout, database "
    "unreachable; see Retry-After", 507: "The database is full: nothing was stored",
}


def responses(*statuses: int) -> dict[int | str, dict]:
    """OpenAPI ``responses`` entries: the problem+json schema for each status."""
    out: dict[int | str, dict] = {}
    for s in statuses:
        entry: dict[str, Any] = {
            "description": _DESCRIPTIONS.get(s, "Error"),
            "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        if s in (429, 503):
            entry["headers"] = {"Retry-After": {"description": "seconds to wait",
                                                "schema": {"type": "integer"}}}
        out[s] = entry
    return out


def add_schemas(openapi: dict, *models: type[BaseModel]) -> dict:
    """Put ``models`` (and their definitions) into ``components.schemas`` of ``openapi``."""
    schemas = openapi.setdefault("components", {}).setdefault("schemas", {})
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in schema.pop("$defs", {}).items():
            schemas.setdefault(name, sub)
        schemas[model.__name__] = schema
    return openapi
