"""The ASGI middleware in front of every route: request id, body-size limit while reading,
concurrency limit, request metrics, the access log, and the last word on unexpected errors.

* ``X-Request-ID``: taken from the request when it is a short token, else generated;
  echoed on the response, used as the problem ``instance`` and in every log line.
* Body size: a ``Content-Length`` above ``max_body_bytes`` is answered 413 before a byte
  of the body is read; a chunked body is counted as it arrives and the read stops with 413
  (:class:`~cloud_api.problems.BodyTooLarge`) once it passes the limit, so at most the
  limit plus one chunk is ever held.
* ``HEAD``: routed as ``GET`` (RFC 9110 §9.3.2); uvicorn sends the headers only.
* Concurrency: more than ``max_concurrent`` requests in flight -> 429 with ``Retry-After``
  (the open probes ``/healthz``, ``/readyz`` and ``/metrics`` are not counted, so an
  orchestrator does not restart a busy replica).
* Metrics (``cloud_api.metrics``): requests by route template, method and status; failures
  by kind; request duration by route; requests in flight.
* Access log: one JSON line per request (request id, method, route template, status,
  duration, key id, problem kind); never the path's values, the query, the body or a key.
"""

from __future__ import annotations

import logging
import os
import re
import time

from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cloud_api import metrics
from cloud_api.problems import BodyTooLarge, internal_error, problem_response
from cloud_api.routes.common import header

access_log = logging.getLogger("cloud_api.access")
error_log = logging.getLogger("cloud_api.errors")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_template(scope: Scope) -> str:
    """The matched route's path template (``/v1/models/{model_id}/predict``), never the
    path itself; ``unmatched`` for unknown paths."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class ServiceMiddleware:
    """See the module docstring. Pure ASGI (no ``BaseHTTPMiddleware``): the body stream is
    passed through, not buffered."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_concurrent: int):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        self._children: dict[tuple, tuple] = {}  # (route, method, status) -> metric children

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "")  # as sent: HEAD is logged and counted as HEAD
        if method == "HEAD":  # RFC 9110: GET's answer; the server drops the body (its own
            scope = {**scope, "method": "GET"}  # scope still says HEAD)
        started = time.perf_counter()
        given = header(scope, b"x-request-id")
        rid = given if given and _REQUEST_ID.match(given) else os.urandom(16).hex()
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        response = {"status": 500, "started": False}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-ID"] = rid
                response["status"] = message["status"]
                response["started"] = True
            await send(message)

        counted = scope.get("path") not in PROBES
        metrics.IN_FLIGHT.inc()
        try:
            early = self._refuse_early(scope, rid, state, counted)
            if early is not None:
                await early(scope, receive, send_with_id)
            else:
                if counted:
                    self.in_flight += 1
                try:
                    await self.app(scope, self._limited(receive), send_with_id)
                finally:
                    if counted:
                        self.in_flight -= 1
        except ClientDisconnect:  # the client went away while its body was read
            response["status"] = 499  # nginx's "client closed request": nobody to answer
            state["problem_kind"] = "client-closed-request"
        except BodyTooLarge as exc:  # raised while reading, not handled by a route
            if not response["started"]:
                await problem_response(rid, 413, "too-large", "Request body too large",
                                       str(exc.detail), headers={"Connection": "close"},
                                       state=state)(scope, receive, send_with_id)
        except Exception:
            error_log.exception("unhandled error", extra={
                "request_id": rid, "method": method,
                "route": route_template(scope)})
            if not response["started"]:
                await internal_error(rid, state)(scope, receive, send_with_id)
        finally:
            metrics.IN_FLIGHT.dec()
            self._record(scope, method, state, rid, response["status"],
                         time.perf_counter() - started)

    def _refuse_early(self, scope: Scope, rid: str, state: dict, counted: bool):
        """A 413 or 429 answer given before the app runs (None to go on)."""
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return problem_response(
                rid, 413, "too-large", "Request body too large",
                f"request body of {int(length)} bytes is over the limit of "
                f"{self.max_body_bytes} bytes", headers={"Connection": "close"}, state=state)
        if counted and self.in_flight >= self.max_concurrent:
            return problem_response(
                rid, 429, "overloaded", "Too many requests",
                f"the server is handling its maximum of {self.max_concurrent} concurrent "
                "requests; retry later", retry_after=1, state=state)
        return None

    def _limited(self, receive: Receive) -> Receive:
        limit = self.max_body_bytes
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        return limited_receive

    def _record(self, scope: Scope, method: str, state: dict, rid: str, status: int,
                seconds: float) -> None:
        route = route_template(scope)
        method = method if method in METHODS else "other"  # bounded label values
        kind = state.get("problem_kind") if status >= 400 else None
        key = (route, method, status)
        children = self._children.get(key)
        if children is None:  # labels() takes a lock and builds a tuple: once per key
            children = self._children[key] = (
                metrics.REQUESTS.labels(route, method, str(status)),
                metrics.REQUEST_DURATION.labels(route))
        children[0].inc()
        children[1].observe(seconds)
        if kind is not None:
            metrics.FAILURES.labels(kind).inc()
        level = logging.DEBUG if scope.get("path") in PROBES and status < 400 else logging.INFO
        if access_log.isEnabledFor(level):
            # makeRecord + handle: Logger.log would also walk the stack for the caller's file
            # and line, which no line of ours shows
            access_log.handle(access_log.makeRecord(
                access_log.name, level, "", 0, "request", (), None, extra={
                    "request_id": rid, "method": method, "route": route, "status": status,
                    "duration_ms": round(seconds * 1000, 3), "key_id": state.get("key_id"),
                    "problem": kind}))
