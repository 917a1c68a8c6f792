"""What every route module uses: JSON answers (orjson), the database of ``app.state``, the
``{model_id}`` path parameter, a header of an ASGI scope."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Path, Request
from starlette.responses import Response
from starlette.types import Scope

from cloud_api.errors import Unavailable
from cloud_api.home import ID_PATTERN

ModelId = Annotated[str, Path(description="model id", pattern=ID_PATTERN)]


def json_response(obj: Any, status: int = 200, headers: dict | None = None) -> Response:
    """``obj`` as ``application/json`` (orjson; numpy values allowed)."""
    return Response(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json", headers=headers)


def database(request: Request):
    """The app's ``store.db.Database``; 503 when the service runs without one."""
    db = getattr(request.app.state, "db", None)
    if db is None:
        raise Unavailable("the database is not configured")
    return db


def header(scope: Scope, name: bytes) -> str | None:
    """The first ``name`` header (lower case) of an ASGI ``scope``, without building a
    ``Headers`` object (the service middleware and predict read one or two per request)."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None
