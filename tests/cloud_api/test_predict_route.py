"""Predict is one route, ``cloud_api.routes.predict.PredictRoute``, first in the app's router:

* its answers, in the order of its checks (key, model id, model, body, payload count, payload
  schema, the model's contract), in-process;
* no other route of the app matches its path (no twin), and its OpenAPI operation is what
  FastAPI writes for a route, from the same pydantic models;
* what is added to that route object applies to the traffic of a real ``cloud-api serve``;
* a client that goes away while its payloads wait in the queue is noticed through ASGI's
  ``http.disconnect`` on a real ``cloud-api serve``: dropped before inference (499), its
  charge refunded, counted by reason."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.cloud_api.conftest import (
    REPO,
    ServerProcess,
    body_of,
    cli_env,
    new_keys,
    onnx_home,
    payloads_for,
)

KEY, ADMIN = "app-predict-route-key", "adm-predict-route-key"
PREDICT = "/v1/models/{model_id}/predict"


@pytest.fixture(scope="module")
def home_dir(tiny_home, tmp_path_factory):
    from cloud_api.home import ModelHome
    from cloud_api.serving.bundles import BundleStore
    from shared.bundle import EdgeBundle

    src = ModelHome(tiny_home.root)
    root = tmp_path_factory.mktemp("predict") / "home"
    home = ModelHome(root).ensure()
    copy = root.parent / "text-v1"
    shutil.copytree(src.version_dir("text", tiny_home.promoted_at_start["text"]), copy)
    home.promote("text", home.register("text", copy, move=True))
    BundleStore(home).add(EdgeBundle.from_model(tiny_home.base))
    return root


def _app(home_dir, **settings):
    from cloud_api.app import create_app
    from cloud_api.settings import Settings

    return create_app(Settings(home=home_dir, api_keys=KEY, admin_keys=ADMIN,
                               worker_in_serve=False, rate_limit_per_key=0,
                               backend="onnx-int8", **settings))


def _answers(app, requests: list[tuple[str, str, dict, bytes | None]]) -> list:
    async def go() -> list:
        out = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for i, (method, path, headers, body) in enumerate(requests):
                    r = await client.request(method, path, content=body, headers={
                        "X-Request-ID": f"r-{i}", "Content-Type": "application/json",
                        **headers})
                    out.append((r.status_code, r.headers, r.json()))
        return out

    return asyncio.run(go())


def test_predict_answers_in_the_order_of_its_checks(home_dir, tiny_bundle_of_home):
    model = {"params": {"eta": 5.0}, "mechanism": "dchi-text"}
    payloads = payloads_for(model, ["a good fun movie", "an awful dull plot"],
                            tiny_bundle_of_home)
    good = body_of(payloads).encode()
    one = json.loads(body_of(payloads[:1]))["payloads"][0]
    auth = {"Authorization": f"Bearer {KEY}"}
    path = "/v1/models/text/predict"
    requests = [
        ("POST", path, auth, good),                                               # 200
        ("POST", path, {}, good),                                                 # 401
        ("POST", "/v1/models/Bad!id/predict", {}, good),                          # key first
        ("POST", "/v1/models/Bad!id/predict", auth, good),                        # 422 id
        ("POST", "/v1/models/nope/predict", auth, b"{not json"),                  # 404 first
        ("POST", path, auth, b"{not json"),                                       # 422 json
        ("POST", path, auth, json.dumps({"payloads": [{"x": 1}] * 4}).encode()),  # count
        ("POST", path, auth, json.dumps({"payloads": [{**one, "text": "x"}]}).encode()),
        ("POST", path, auth, json.dumps({"payloads": [{**one, "params": {"eta": 6.0}}]}
                                        ).encode()),                              # contract
        ("GET", path, auth, None),                                                # 405
    ]
    got = _answers(_app(home_dir, max_payloads_per_request=3, default_budget=1e9), requests)
    assert [(s, b.get("type", "").removeprefix("urn:privbert:problem:")) for s, _, b in got] \
        == [(200, ""), (401, "unauthorized"), (401, "unauthorized"), (422, "validation"),
            (404, "not-found"), (422, "validation"), (413, "too-many-payloads"),
            (422, "validation"), (422, "payload-mismatch"), (405, "method-not-allowed")]
    ok, headers, answer = got[0]
    assert answer["model_id"] == "text" and len(answer["predictions"]) == 2
    assert float(headers["x-privacy-budget-remaining"]) < 1e9  # charged
    assert got[1][1]["www-authenticate"] == "Bearer"
    assert got[3][2]["detail"] == ("path.model_id: String should match pattern "
                                   "'^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'")
    assert got[3][2]["errors"][0]["loc"] == ["path", "model_id"]
    assert got[5][2]["detail"] == "body: Invalid JSON: key must be a string at line 1 column 2"
    assert got[6][2]["detail"] == "4 payloads in one request; at most 3 (send several requests)"
    assert got[7][2]["errors"][0]["type"] == "extra_forbidden"
    assert [h.get("x-request-id") for _, h, _ in got] == [f"r-{i}" for i in range(len(got))]


def test_predict_is_one_route_first_in_the_router_and_documented_from_its_models(home_dir):
    from fastapi import Depends, FastAPI
    from starlette.routing import Match

    from cloud_api.problems import add_schemas
    from cloud_api.routes import predict

    app = _app(home_dir)
    routes = app.router.routes
    assert isinstance(routes[0], predict.PredictRoute)
    for method, first in (("POST", Match.FULL), ("GET", Match.PARTIAL)):
        scope = {"type": "http", "method": method, "path": "/v1/models/text/predict",
                 "root_path": "", "headers": [], "query_string": b""}
        match, child = routes[0].matches(dict(scope))
        assert match is first and child["route"] is routes[0]
        assert [r for r in routes[1:] if r.matches(dict(scope))[0] is not Match.NONE] == []

    doc = app.openapi()
    item = doc["paths"][PREDICT]
    assert list(item) == ["post"]
    op = item["post"]
    assert op["operationId"] == "predict_v1_models__model_id__predict_post"
    assert op["tags"] == ["inference"] and op["security"] == [{"bearer": []}]
    assert op["parameters"] == [{"name": "model_id", "in": "path", "required": True,
                                 "schema": {"type": "string", "title": "Model Id",
                                            "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                                            "description": "model id"},
                                 "description": "model id"}]
    assert op["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PredictRequest"}
    assert sorted(op["responses"], key=int) == ["200", "401", "403", "404", "413", "422",
                                                "429", "500", "503", "507"]
    assert op["responses"]["413"]["content"]["application/problem+json"]["schema"] == {
        "$ref": "#/components/schemas/Problem"}
    want = add_schemas({}, predict.PredictRequest, predict.PredictResponse)["components"]
    for name, schema in want["schemas"].items():
        assert doc["components"]["schemas"][name] == schema
    paths = list(doc["paths"])  # where FastAPI put it: after GET /v1/models
    assert paths[paths.index("/v1/models") + 1] == PREDICT

    async def dependency() -> None:
        return None

    with pytest.raises(ValueError, match="app-wide FastAPI dependencies"):
        predict.install(FastAPI(dependencies=[Depends(dependency)]))


# a `cloud-api serve` whose app gets one route-level middleware on the predict route object
# of its router (as Starlette's Route(middleware=...) installs one)
MARKED_SERVE = """
import sys
from cloud_api import app as app_module, cli
from cloud_api.routes.predict import PredictRoute

class Seen:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def marked(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message["headers"], (b"x-seen-by-route", b"predict")]
            await send(message)
        await self.app(scope, receive, marked)

made = app_module.create_app

def create_app(settings=None):
    app = made(settings)
    route = next(r for r in app.router.routes if isinstance(r, PredictRoute))
    route.app = Seen(route.app)
    return app

app_module.create_app = create_app
sys.exit(cli.main(["serve", "--host", "127.0.0.1", "--port", sys.argv[1]]))
"""


class MarkedServer(ServerProcess):
    def launch(self) -> MarkedServer:
        from tests.cloud_api.conftest import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen([sys.executable, "-c", MARKED_SERVE, str(port)],
                                         cwd=REPO, env=cli_env(self.env), stdout=fh,
                                         stderr=subprocess.STDOUT)
        return self


def test_what_is_added_to_the_route_applies_to_a_real_servers_predictions(
        tiny_home, tiny_bundle_of_home, tmp_path):
    home, _ = onnx_home(tiny_home, tmp_path / "home")
    srv = MarkedServer(home.root, tmp_path / "serve.log", new_keys(),
                       {"PRIVBERT_BACKEND": "onnx", "PRIVBERT_WORKER_IN_SERVE": "0",
                        "PRIVBERT_RATE_LIMIT_PER_KEY": "0"}).start()
    try:
        body = body_of(payloads_for(srv.model("text"), ["a fine film"], tiny_bundle_of_home))
        for _ in range(20):  # inline (idle) forwards and, every 16th, the batcher's thread
            r = httpx.post(f"{srv.url}/v1/models/text/predict", content=body, timeout=30,
                           headers={**srv.headers(), "Content-Type": "application/json"})
            assert r.status_code == 200, r.text
            assert r.headers.get("x-seen-by-route") == "predict"
        other = httpx.get(f"{srv.url}/v1/models", headers=srv.headers(), timeout=30)
        assert other.status_code == 200 and "x-seen-by-route" not in other.headers
        assert srv.metric("privbert_request_total", route=PREDICT, method="POST",
                          status="200") == 20
    finally:
        srv.stop()


def _budget_spent(srv: ServerProcess) -> float:
    from cloud_api.auth import key_id

    r = httpx.get(f"{srv.url}/admin/budgets/{key_id(srv.app_key)}",
                  headers=srv.headers(srv.admin_key), timeout=30)
    r.raise_for_status()
    return float(r.json()["spent"])


def test_a_client_that_goes_away_while_queued_is_noticed_and_refunded(
        tiny_home, tiny_bundle_of_home, tmp_path):
    home, _ = onnx_home(tiny_home, tmp_path / "home")
    # one inference worker; after a request of 8 payloads the batcher waits (up to 3 s) for
    # about as many before it runs the next lone payload: the window in which it leaves
    srv = ServerProcess(home.root, tmp_path / "serve.log", new_keys(),
                        {"PRIVBERT_BACKEND": "onnx", "PRIVBERT_WORKER_IN_SERVE": "0",
                         "PRIVBERT_RATE_LIMIT_PER_KEY": "0", "PRIVBERT_INFERENCE_WORKERS": "1",
                         "PRIVBERT_MAX_WAIT_MS": "3000", "PRIVBERT_DEFAULT_BUDGET": "1e9"}
                        ).start()
    try:
        model = srv.model("text")
        texts = [f"a film number {i} that was fine" for i in range(8)]
        many = body_of(payloads_for(model, texts, tiny_bundle_of_home))
        r = httpx.post(f"{srv.url}/v1/models/text/predict", content=many, timeout=30,
                       headers={**srv.headers(), "Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        spent = _budget_spent(srv)
        assert spent > 0
        lone = body_of(payloads_for(model, ["dull"], tiny_bundle_of_home)).encode()
        u = urlsplit(srv.url)
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            s.sendall(f"POST /v1/models/text/predict HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {srv.app_key}\r\nContent-Type: application/json"
                      f"\r\nContent-Length: {len(lone)}\r\n\r\n".encode() + lone)
            deadline = time.monotonic() + 20
            while srv.metric("privbert_queue_size", model="text") < 1:
                assert time.monotonic() < deadline, "the request was never queued"
                time.sleep(0.02)
        # the socket is closed: the batcher drops the request, its charge comes back
        deadline = time.monotonic() + 20
        while srv.metric("privbert_privacy_refunds_total", reason="client-gone") < 1:
            assert time.monotonic() < deadline, f"no refund:\n{srv.log_tail()}"
            time.sleep(0.05)
        assert _budget_spent(srv) == pytest.approx(spent, rel=1e-12)
        # the request is counted, then logged, after the middleware learns the client left
        [line, *_] = srv.wait_log(lambda ln: ln.get("status") == 499)
        assert srv.metric("privbert_request_total", route=PREDICT, method="POST",
                          status="499") == 1
        assert line["route"] == PREDICT and line["problem"] == "client-closed-request"
        # the connection it left is gone; the next client is answered as usual
        r = httpx.post(f"{srv.url}/v1/models/text/predict", content=lone, timeout=30,
                       headers={**srv.headers(), "Content-Type": "application/json"})
        assert r.status_code == 200 and _budget_spent(srv) > spent
    finally:
        srv.stop()
