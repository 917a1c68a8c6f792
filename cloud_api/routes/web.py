"""The service and browsers: CORS on ``/v1`` by setting, and the privacy explorer at ``/demo``.

* CORS (``PRIVBERT_CORS_ORIGINS``, none by default): Starlette's ``CORSMiddleware``, installed
  outermost (around the service middleware and every route), and only for ``/v1/``: a page
  may never call ``/admin`` (no preflight is answered there, no CORS header is ever sent).
  Bearer keys, not cookies: no credentials mode. The headers a page reads are exposed
  (budget left, ``Retry-After``, request id, ``ETag``). A refused preflight is a 400
  problem+json naming what was refused.
* A refused preflight is logged (a warning: the origin, the method and the header names it
  asked for; a preflight has no body), so an operator sees which page was turned away.
* ``/demo`` (``PRIVBERT_DEMO=1``): the page built from ``web_edge/demo`` (Vite), same origin
  as ``/v1``, under a strict Content-Security-Policy (scripts and connections to this
  origin only; ``'wasm-unsafe-eval'`` for onnxruntime-web's WebAssembly) and cross-origin
  isolation (COOP/COEP: WebAssembly threads need ``SharedArrayBuffer``). The build writes
  compressed copies beside its files (``x.br``, ``x.gz``); the one the browser accepts is
  sent. Files under ``assets/`` are named by their content (Vite's hash), so they are
  ``Cache-Control: public, max-age=31536000, immutable``: a second visit downloads none of
  them; the page itself is ``no-cache`` (revalidated, 304 when unchanged).
  ``/demo/config.json`` hands the page ``PRIVBERT_DEMO_KEY`` when one is set: a key that
  anyone who opens the page can read, so a throwaway application key with a small budget,
  never a production key and never an admin key (refused at start).
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import orjson
from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cloud_api.problems import problem_response
from cloud_api.settings import Settings

log = logging.getLogger("cloud_api.web")

CORS_PREFIX = "/v1/"
ALLOW_METHODS = ["GET", "HEAD", "POST"]
ALLOW_HEADERS = ["Authorization", "Content-Type", "Idempotency-Key", "If-None-Match",
                 "X-Device-Id", "X-Request-ID"]
EXPOSE_HEADERS = ["X-Privacy-Budget-Remaining", "Retry-After", "X-Request-ID", "ETag",
                  "X-Bundle-Bytes"]
PREFLIGHT_MAX_AGE_S = 600

CSP = "; ".join([
    "default-src 'none'",
    "script-src 'self' 'wasm-unsafe-eval'",
    "worker-src 'self'",
    "connect-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
])
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_DEMO_ROUTE = SimpleNamespace(path="/demo/{path}")  # the access log's and metrics' route label
IMMUTABLE = "public, max-age=31536000, immutable"
# the precompressed copies the build writes, in order of preference
ENCODINGS = (("br", ".br"), ("gzip", ".gz"))
BUILD_HINT = "bash scripts/build_web.sh (npm ci and npm run build in web_edge/demo)"


class _ProblemCORS(CORSMiddleware):
    """Starlette's CORS with a refused preflight answered as problem+json."""

    def preflight_response(self, request_headers: Headers) -> Response:
        answer = super().preflight_response(request_headers)
        if answer.status_code < 400:
            return answer
        refused = bytes(answer.body).decode().removeprefix("Disallowed CORS ")
        log.warning("CORS preflight refused: %s", refused, extra={
            "origin": _clip(request_headers.get("origin", "")),
            "method": _clip(request_headers.get("access-control-request-method", "")),
            "headers": _clip(request_headers.get("access-control-request-headers", "")),
            "refused": refused})
        headers = {k: v for k, v in answer.headers.items()
                   if k.lower().startswith("access-control-") or k.lower() == "vary"}
        return problem_response(
            None, 400, "cors-refused", "CORS preflight refused",
            f"this server does not allow the requested {refused} (PRIVBERT_CORS_ORIGINS; "
            f"methods {', '.join(ALLOW_METHODS)}; headers {', '.join(ALLOW_HEADERS)})",
            headers=headers)


def _clip(value: str, limit: int = 200) -> str:
    """A header value as logged: printable, at most ``limit`` characters."""
    clean = "".join(c if c.isprintable() else "?" for c in value)
    return clean if len(clean) <= limit else clean[:limit - 1] + "…"


class V1CORS:
    """CORS for paths under ``/v1/`` only; every other request passes untouched."""

    def __init__(self, app: ASGIApp, *, origins: list[str]):
        self.app = app
        self.cors = _ProblemCORS(app, allow_origins=origins, allow_methods=ALLOW_METHODS,
                                 allow_headers=ALLOW_HEADERS, expose_headers=EXPOSE_HEADERS,
                                 allow_credentials=False, max_age=PREFLIGHT_MAX_AGE_S)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(CORS_PREFIX):
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)


# -- /demo -----------------------------------------------------------------------------------
def demo_dir(settings: Settings) -> Path:
    """Where the built page is: ``PRIVBERT_DEMO_DIR``, else ``web_edge/demo/dist`` of this
    checkout."""
    if settings.demo_dir is not None:
        return settings.demo_dir
    return Path(__file__).resolve().parents[2] / "web_edge" / "demo" / "dist"


def check_demo(settings: Settings) -> None:
    """ValueError (one line) when ``/demo`` is enabled but cannot be served."""
    if not settings.demo:
        return
    index = demo_dir(settings) / "index.html"
    if not index.is_file():
        raise ValueError(f"PRIVBERT_DEMO=1 but the demo page is not built ({index} is "
                         f"missing): build it with {BUILD_HINT}, or set PRIVBERT_DEMO_DIR")


def _accepts(accept_encoding: str, coding: str) -> bool:
    """Whether an Accept-Encoding value admits ``coding`` (q > 0)."""
    for part in accept_encoding.split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() in (coding, "*"):
            q = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
            try:
                return float(q) > 0
            except ValueError:
                return False
    return False


class PrecompressedFiles(StaticFiles):
    """Starlette's static files, sending the build's ``x.br`` or ``x.gz`` copy of ``x`` when
    the browser accepts that encoding (its own ETag, ``Content-Encoding``, the type of
    ``x``), with ``Vary: Accept-Encoding`` on every file that has copies."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        accept = Headers(scope=scope).get("accept-encoding", "")
        variants = False
        if scope["method"] in ("GET", "HEAD"):
            # the folder itself is its index.html (StaticFiles' html mode)
            target = "index.html" if path in ("", ".") else path
            for coding, suffix in ENCODINGS:
                full, found = self.lookup_path(target + suffix)
                if found is None or not stat.S_ISREG(found.st_mode):
                    continue
                variants = True
                if _accepts(accept, coding):
                    answer = self.file_response(full, found, scope)
                    answer.headers["content-encoding"] = coding
                    answer.headers["content-type"] = (
                        self._type_of(target) or answer.headers.get("content-type", ""))
                    answer.headers["vary"] = "Accept-Encoding"
                    return answer
        answer = await super().get_response(path, scope)
        if variants:
            answer.headers["vary"] = "Accept-Encoding"
        return answer

    @staticmethod
    def _type_of(path: str) -> str | None:
        import mimetypes

        kind, _ = mimetypes.guess_type(os.path.basename(path))
        if kind is None:
            return None
        return f"{kind}; charset=utf-8" if kind.startswith("text/") else kind


class DemoPage:
    """The built page's files with :data:`PAGE_HEADERS` (content-named ``assets/`` immutable,
    the rest revalidated), precompressed where the build left copies, and ``config.json``."""

    def __init__(self, directory: Path, api_key: str | None):
        self.files = PrecompressedFiles(directory=directory, html=True)
        self.config = orjson.dumps({"api_key": api_key})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        immutable = _route_path(scope).startswith("/assets/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for k, v in PAGE_HEADERS.items():
                    headers[k] = v
                if "cache-control" not in headers:  # an error is never kept for a year
                    ok = message["status"] in (200, 304)
                    headers["Cache-Control"] = IMMUTABLE if immutable and ok else "no-cache"
            await send(message)

        scope["route"] = _DEMO_ROUTE  # the router's scope: the service middleware reads it
        if scope["type"] == "http" and _route_path(scope) == "/config.json":
            answer = Response(self.config, media_type="application/json",
                              headers={"Cache-Control": "no-store"})
            await answer(scope, receive, send_with_headers)
            return
        await self.files(scope, receive, send_with_headers)


def _route_path(scope: Scope) -> str:
    """The path below the mount point (``/config.json``)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def install(app, settings: Settings) -> None:
    """``/demo`` when enabled (ValueError when not built) and CORS on ``/v1`` when origins
    are set. Call after every other middleware is added: CORS must be the outermost layer,
    in front of the service middleware."""
    if settings.demo:
        check_demo(settings)
        key = settings.demo_key.get_secret_value() if settings.demo_key else None
        app.mount("/demo", DemoPage(demo_dir(settings), key), name="demo")
    if settings.cors_origins:
        app.add_middleware(V1CORS, origins=list(settings.cors_origins))
