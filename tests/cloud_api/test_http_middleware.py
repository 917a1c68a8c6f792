"""The middleware's last word on an unexpected exception (no input reaches that path in the
real app: the fuzz test proves it), checked on a small FastAPI app with the real middleware
and problem handlers and a route that fails on purpose."""

from __future__ import annotations

import asyncio
import logging

import httpx
from fastapi import FastAPI, Request

from cloud_api import problems
from cloud_api.errors import problem_type
from cloud_api.routes.middleware import ServiceMiddleware


def _app() -> FastAPI:
    app = FastAPI()
    problems.install(app)

    @app.post("/boom")
    async def boom(request: Request):
        body = await request.body()
        raise RuntimeError(f"bug while handling {len(body)} bytes")

    app.add_middleware(ServiceMiddleware, max_body_bytes=1024, max_concurrent=4)
    return app


def _post(app: FastAPI, content) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            return await c.post("/boom", content=content, headers={"X-Request-ID": "r-1"})

    return asyncio.run(go())


def test_unexpected_exception_is_a_logged_500_problem_without_the_body(caplog):
    with caplog.at_level(logging.INFO):
        r = _post(_app(), b"secret-sentence-xyz")
    assert r.status_code == 500 and r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"] == problem_type("internal") and body["instance"] == "r-1"
    assert "bug" not in body["detail"] and "secret" not in r.text
    errors = [rec for rec in caplog.records if rec.name == "cloud_api.errors"]
    assert errors and errors[0].exc_info and errors[0].request_id == "r-1"
    assert "secret-sentence-xyz" not in caplog.text
    access = [rec for rec in caplog.records if rec.name == "cloud_api.access"]
    assert access and access[0].status == 500 and access[0].route == "/boom"


def test_body_over_the_limit_is_413_by_length_or_while_it_streams():
    r = _post(_app(), b"x" * 5000)  # Content-Length: refused before the app runs
    assert r.status_code == 413 and r.json()["type"] == problem_type("too-large")
    async def streamed():  # no length: cut while the route reads it
        for _ in range(3):
            yield b"x" * 600

    r = _post(_app(), streamed())
    assert r.status_code == 413 and r.json()["type"] == problem_type("too-large")
    assert "larger than 1024 bytes" in r.json()["detail"]


def test_head_is_routed_as_get_and_logged_as_head(caplog):
    app = FastAPI()
    problems.install(app)

    @app.get("/thing")
    async def thing():
        return {"ok": True}

    app.add_middleware(ServiceMiddleware, max_body_bytes=1024, max_concurrent=4)

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            return await c.head("/thing")

    with caplog.at_level(logging.INFO):
        r = asyncio.run(go())
    assert r.status_code == 200
    access = [rec for rec in caplog.records if rec.name == "cloud_api.access"]
    assert access and (access[0].method, access[0].route) == ("HEAD", "/thing")
