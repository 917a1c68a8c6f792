"""``GET /healthz`` (the process answers), ``GET /readyz`` (every promoted model loaded and
warmed, the database answering, and whatever else registered a readiness check: the app's
``ready_checks``), ``GET /metrics`` (Prometheus)."""

from __future__ import annotations

import inspect

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field
from starlette.responses import Response

from cloud_api import metrics
from cloud_api.errors import Unavailable
from cloud_api.problems import responses

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str
    problems: dict[str, str] | None = Field(None, description="what is wrong without making "
                                            "the service unready (e.g. a promotion that "
                                            "failed while the previous version serves)")


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses=responses(503),
            summary="Readiness: every promoted model is loaded and warmed, and the database answers")
async def readyz(request: Request) -> Health:
    """Each entry of ``app.state.ready_checks`` returns ``(ready, {component: problem})``,
    directly or as an awaitable; one that is not ready makes this a 503 listing the
    problems."""
    ready, problems = True, {}
    for check in getattr(request.app.state, "ready_checks", []):
        found = check()
        if inspect.isawaitable(found):
            found = await found
        ok, found = found
        ready = ready and ok
        problems.update(found)
    if not ready:
        listed = "; ".join(f"{name}: {why}" for name, why in sorted(problems.items()))
        raise Unavailable(f"not ready: {listed or 'starting'}", retry_after=1)
    return Health(status="ready", problems=problems or None)


@router.get("/metrics", summary="Prometheus metrics (text format)",
            response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
                             "description": "Prometheus exposition format"}})
async def metrics_text() -> Response:
    """The whole server's metrics, whichever worker answers (``cloud_api.metrics``)."""
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
