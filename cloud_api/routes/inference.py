"""``GET /v1/models`` (the served models) and ``GET /v1/bundles/{bundle_id}`` (an edge bundle
as a tarball, gzip when the client accepts it: :mod:`cloud_api.routes.compression`).
Predict, ``POST /v1/models/{model_id}/predict``, is its own route:
:mod:`cloud_api.routes.predict`.

A bundle is named by its content (the id is its hash): ``Cache-Control: private,
max-age=31536000, immutable`` (private: it is answered to a key, so no shared cache may hand
it to whoever asks), ``ETag`` the id, and ``X-Bundle-Bytes`` its length before compression
(a page's download progress: ``Content-Length`` counts the compressed bytes).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from cloud_api.auth import AppCaller
from cloud_api.problems import responses
from cloud_api.routes.common import json_response
from cloud_api.routes.compression import CompressedTarballs, accepts_gzip
from cloud_api.routes.predict import TAGS

router = APIRouter(prefix="/v1", tags=TAGS)

BUNDLE_BYTES_HEADER = "X-Bundle-Bytes"
BUNDLE_CACHE_CONTROL = "private, max-age=31536000, immutable"

BundleId = Annotated[str, Path(description="bundle id: 64 hex digits",
                               pattern=r"^[0-9a-f]{64}$")]


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
    return json_response({"models": request.app.state.served_models.describe()})


@router.get(
    "/bundles/{bundle_id}", response_model=None, summary="The edge bundle as a tarball",
    responses={200: {"content": {"application/x-tar": {"schema": {"type": "string",
                                                                    "format": "binary"}}},
                     "description": "bundle tarball; ETag = bundle id"},
               304: {"description": "If-None-Match matched the bundle id"},
               **responses(401, 403, 404, 422, 429, 503)})
async def get_bundle(bundle_id: BundleId, request: Request, caller: AppCaller,
                     if_none_match: Annotated[str | None, Header()] = None,
                     accept_encoding: Annotated[str | None, Header()] = None) -> Response:
    bundles = request.app.state.bundles
    await run_in_threadpool(bundles.get, bundle_id)  # NotFound before any 304
    etag = f'"{bundle_id}"'
    headers = {"ETag": etag, "Cache-Control": BUNDLE_CACHE_CONTROL, "Vary": "Accept-Encoding"}
    if if_none_match is not None and _matches(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    data = await run_in_threadpool(bundles.tarball, bundle_id)
    headers[BUNDLE_BYTES_HEADER] = str(len(data))
    if accepts_gzip(accept_encoding):
        copies: CompressedTarballs = request.app.state.compressed_tarballs
        packed = await run_in_threadpool(copies.gzip, bundle_id, data)
        if packed is not None:
            return Response(packed, media_type="application/x-tar",
                            headers={**headers, "Content-Encoding": "gzip"})
    return Response(data, media_type="application/x-tar", headers=headers)


def _matches(header: str, etag: str) -> bool:
    tags = [t.strip() for t in header.split(",")]
    return any(t == "*" or t.removeprefix("W/") == etag for t in tags)
