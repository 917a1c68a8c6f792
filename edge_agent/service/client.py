"""HTTP client for the privbert API (docs/http-api.md), with httpx.

Many payloads per request (``batch_size``), retries with exponential backoff on
429/503 and connection errors (honouring ``Retry-After``), timeouts, the
``Authorization: Bearer`` header, and problem+json errors (RFC 9457) raised as
:class:`ApiError` carrying the server's ``type``, ``title`` and ``detail``.
Only privatized payloads travel: the client takes payload objects, never text.
An answer that is not the service's (an HTML page, a 404 for ``/v1/models``) says
so and asks whether ``--server`` is the URL of a privbert service.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx

from shared.conventions import fmt_eps as fmt

API_KEY_ENV = "PRIVBERT_API_KEY"
RETRY_STATUS = (429, 503)
_BUNDLE_ID = re.compile(r"^[0-9a-f]{64}$")
SERVICE_HINT = "(is --server the URL of a privbert service?)"


class ApiError(Exception):
    """An error answer of the server (or no answer): one line that says what to do.

    ``partial``: what earlier requests of the same call returned before this one failed
    (predictions, or the ids of records the server has stored).
    """

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None,
                 title: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.partial: list = []


def _batches(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _short(text: str, limit: int = 120) -> str:
    """One printable line of at most ``limit`` characters."""
    line = "".join(c for c in " ".join(text.split()) if c.isprintable())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def body_description(resp: httpx.Response) -> str:
    """A short plain description of a body that is not JSON (never a page of HTML)."""
    ctype = resp.headers.get("Content-Type", "").lower()
    text = resp.text.strip()
    if "html" in ctype or text[:1] == "<":
        return "an HTML page, not a privbert answer"
    return _short(text, 80)


BUDGET_EXHAUSTED = "urn:privbert:problem:budget-exhausted"


def problem_error(resp: httpx.Response, discovery: str | None = None) -> ApiError:
    """An :class:`ApiError` from an error response, problem+json or not.

    ``discovery``: the path when it is GET /v1/models or /v1/bundles/...; there an answer
    that is not problem+json, or a 404 for /v1/models, adds :data:`SERVICE_HINT`.
    """
    status = resp.status_code
    problem: dict[str, Any] = {}
    try:
        body = resp.json()
        if isinstance(body, dict):
            problem = body
    except (ValueError, UnicodeDecodeError):
        pass
    ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
    is_problem = bool(problem) and ctype == "application/problem+json"
    title = _short(str(problem.get("title") or resp.reason_phrase or "error"), 80)
    detail = problem.get("detail")
    if detail is not None and not isinstance(detail, str):
        detail = json.dumps(detail)
    if detail is None and not problem and resp.text.strip():
        detail = body_description(resp)
    detail = None if detail is None else _short(detail, 300)
    ptype = problem.get("type")
    msg = f"server answered {status} {title}"
    if detail:
        msg += f": {detail}"
    if ptype and ptype != "about:blank":
        msg += f" [{_short(str(ptype), 120)}]"
    if discovery and (not is_problem or (status == 404 and discovery == "/v1/models")):
        msg += f" {SERVICE_HINT}"
    if status == 401:
        msg += f" (check --api-key or ${API_KEY_ENV})"
    elif status == 403 and ptype == BUDGET_EXHAUSTED:
        left = problem.get("remaining", resp.headers.get("X-Privacy-Budget-Remaining"))
        try:

            left = fmt(float(left))
        except (TypeError, ValueError):
            left = "unknown"
        msg += (f" (the server's privacy budget for this key or device: remaining {left} "
                "worst-case epsilon; its admin sets the cap)")
    elif status == 403:
        msg += " (this key may not use that endpoint)"
    elif status == 413:
        msg += " (request too large: lower --post-batch)"
    return ApiError(msg, status=status, type=ptype, title=title,
                    detail=detail if isinstance(detail, str) else None)


class PrivbertClient:
    """``PrivbertClient(base_url, api_key)``; ``transport`` and ``sleep`` are for tests."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 30.0,
                 retries: int = 5, backoff: float = 0.5, max_backoff: float = 30.0,
                 batch_size: int = 64, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        if not re.match(r"^https?://", base_url or ""):
            raise ValueError(f"server URL must start with http:// or https://, got {base_url!r}")
        if batch_size < 1:
            raise ValueError(f"batch size must be an integer >= 1, got {batch_size!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries!r}")
        self.base_url = base_url.rstrip("/")
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        headers = {"User-Agent": "privbert-edge-agent/0.1"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.batch_size = batch_size
        self._sleep = sleep
        self.served_ids: list[str] | None = None  # the model ids of the last GET /v1/models
        self._http = httpx.Client(base_url=self.base_url, headers=headers, transport=transport,
                                  timeout=httpx.Timeout(timeout))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PrivbertClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transport with retries ------------------------------------------------------------
    def _delay(self, attempt: int, resp: httpx.Response | None) -> float:
        if resp is not None:
            after = resp.headers.get("Retry-After", "")
            if after.strip().isdigit():
                return min(float(after), self.max_backoff)
        base = min(self.backoff * 2**attempt, self.max_backoff)
        return base * (0.5 + random.random() / 2)  # jitter: replicas do not retry in step

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        """One call with retries; a non-2xx final answer raises :class:`ApiError`."""
        url = f"{self.base_url}{path}"
        discovery = path if method == "GET" and (
            path == "/v1/models" or path.startswith("/v1/bundles/")) else None
        for attempt in range(self.retries + 1):
            resp = None
            try:
                resp = self._http.request(method, path, **kwargs)
            except httpx.TimeoutException as exc:
                last = f"no answer from {url} in time ({type(exc).__name__})"
            except httpx.TransportError as exc:
                last = f"cannot reach {url} ({exc or type(exc).__name__})"
            else:
                if resp.status_code not in RETRY_STATUS:
                    if resp.is_success:
                        return resp
                    raise problem_error(resp, discovery)
                last = str(problem_error(resp, discovery))
            if attempt < self.retries:
                self._sleep(self._delay(attempt, resp))
        raise ApiError(f"{last}; gave up after {self.retries + 1} attempts (check --server "
                       "and that the service is running)",
                       status=None if resp is None else resp.status_code)

    def _json(self, resp: httpx.Response) -> Any:
        try:
            return resp.json()
        except ValueError:
            raise ApiError(f"{resp.request.url}: answer is not JSON but "
                           f"{body_description(resp)} {SERVICE_HINT}",
                           status=resp.status_code) from None

    # -- endpoints -------------------------------------------------------------------------
    def models(self) -> list[dict]:
        """``GET /v1/models``: the served models (id, task, labels, mechanism, params, bundle_id)."""
        body = self._json(self.request("GET", "/v1/models"))
        models = body.get("models") if isinstance(body, dict) else body
        if not isinstance(models, list):
            raise ApiError(f"GET /v1/models: unexpected answer (no list of models) {SERVICE_HINT}")
        return models

    def model(self, model_id: str | None = None) -> dict:
        """The served model ``model_id``; without an id, the only one served."""
        models = self.models()
        ids = [str(m.get("id")) for m in models]
        self.served_ids = ids  # what a pin checks a new model against (a rename)
        if model_id is None:
            if len(models) == 1:
                return models[0]
            raise ApiError(f"the server serves {len(models)} models ({', '.join(ids) or 'none'}): "
                           "pick one with --model ID")
        for m in models:
            if str(m.get("id")) == model_id:
                return m
        raise ApiError(f"the server has no model {model_id!r}; it serves: "
                       f"{', '.join(ids) or 'none'}")

    def bundle_bytes(self, bundle_id: str) -> bytes:
        """``GET /v1/bundles/{bundle_id}``: the bundle tarball."""
        if not _BUNDLE_ID.match(bundle_id or ""):
            raise ApiError(f"not a bundle id (64 hex digits): {bundle_id!r}")
        return self.request("GET", f"/v1/bundles/{bundle_id}").content

    def predict(self, model_id: str, payloads: Iterable) -> list[dict]:
        """``POST /v1/models/{id}/predict`` in requests of at most ``batch_size`` payloads."""
        out: list[dict] = []
        try:
            for batch in _batches(list(payloads), self.batch_size):
                body = '{"payloads":[' + ",".join(_to_json(p) for p in batch) + "]}"
                resp = self.request("POST", f"/v1/models/{model_id}/predict", content=body,
                                    headers={"Content-Type": "application/json"})
                preds = self._json(resp)
                preds = preds.get("predictions") if isinstance(preds, dict) else None
                if not isinstance(preds, list) or len(preds) != len(batch):
                    raise ApiError(f"predict: expected {len(batch)} predictions, got "
                                   f"{len(preds) if isinstance(preds, list) else 'none'}")
                out.extend(preds)
        except ApiError as exc:
            exc.partial = out  # the predictions of the requests before it
            raise
        return out

    def post_records(self, task: str, records: Iterable,
                     idempotency_key: str | None = None) -> list:
        """``POST /v1/records`` in batches; each batch has its own Idempotency-Key, kept
        across its retries so that a retried upload is stored once. Returns the record ids.

        A failed request raises :class:`ApiError` whose ``partial`` holds the ids of the
        records stored by the requests before it (the first ``len(partial)`` records).
        """
        ids: list = []
        prefix = idempotency_key or uuid.uuid4().hex
        try:
            for n, batch in enumerate(_batches(list(records), self.batch_size)):
                body = ('{"task":' + json.dumps(task) + ',"records":['
                        + ",".join(_to_json(r) for r in batch) + "]}")
                resp = self.request("POST", "/v1/records", content=body,
                                    headers={"Content-Type": "application/json",
                                             "Idempotency-Key": f"{prefix}-{n}"})
                got = self._json(resp)
                if isinstance(got, dict):
                    got = got.get("ids", got.get("record_ids"))
                if not isinstance(got, list) or len(got) != len(batch):
                    raise ApiError(f"records: expected {len(batch)} record ids, got "
                                   f"{len(got) if isinstance(got, list) else 'none'}")
                ids.extend(got)
        except ApiError as exc:
            exc.partial = ids  # stored by the server: the caller reports them
            raise
        return ids


def _to_json(obj) -> str:
    """A payload or record (pydantic model), its JSON already serialized (bytes: sent as
    they are), or a plain dict, as JSON text."""
    if isinstance(obj, bytes | bytearray):
        return obj.decode("utf-8")
    if hasattr(obj, "model_dump_json"):
        return obj.model_dump_json(exclude_none=True)
    return json.dumps(obj)
