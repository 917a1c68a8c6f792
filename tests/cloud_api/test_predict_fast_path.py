"""Predict's fast path (the service middleware hands it ``predict_asgi``, past FastAPI's
router and dependencies) answers exactly as the FastAPI route does: the same statuses,
problem types and details, the same predictions, the same checks in the same order (key,
model, body, payload count, payload schema, the model's contract). Both apps run in this
process over the same home, one of them built with the fast path switched off."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import pytest

from tests.cloud_api.conftest import body_of, payloads_for

KEY, ADMIN = "app-fast-path-key", "adm-fast-path-key"


@pytest.fixture(scope="module")
def home_dir(tiny_home, tmp_path_factory):
    from cloud_api.home import ModelHome
    from cloud_api.serving.bundles import BundleStore
    from shared.bundle import EdgeBundle

    src = ModelHome(tiny_home.root)
    root = tmp_path_factory.mktemp("fast") / "home"
    home = ModelHome(root).ensure()
    copy = root.parent / "text-v1"
    shutil.copytree(src.version_dir("text", tiny_home.promoted_at_start["text"]), copy)
    home.promote("text", home.register("text", copy, move=True))
    BundleStore(home).add(EdgeBundle.from_model(tiny_home.base))
    return root


def _answers(home_dir, requests: list[tuple[dict, bytes]], fast: bool, monkeypatch) -> list:
    from cloud_api import app as app_module
    from cloud_api.routes import inference
    from cloud_api.settings import Settings

    with monkeypatch.context() as m:
        if not fast:
            m.setattr(inference, "predict_route", lambda scope: None)
        app = app_module.create_app(Settings(
            home=home_dir, api_keys=KEY, admin_keys=ADMIN, worker_in_serve=False,
            max_payloads_per_request=3, rate_limit_per_key=0, backend="onnx-int8"))

    async def go() -> list:
        out = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for i, (headers, body) in enumerate(requests):
                    path = headers.pop("path", "/v1/models/text/predict")
                    r = await client.post(path, content=body, headers={
                        "X-Request-ID": f"r-{i}", "Content-Type": "application/json",
                        **headers})
                    out.append((r.status_code, r.headers.get("content-type"),
                                r.headers.get("www-authenticate"), r.json()))
        return out

    return asyncio.run(go())


def test_fast_path_answers_as_the_fastapi_route(home_dir, tiny_bundle_of_home, monkeypatch):
    model = {"params": {"eta": 5.0}, "mechanism": "dchi-text"}
    payloads = payloads_for(model, ["a good fun movie", "an awful dull plot", "fine"],
                            tiny_bundle_of_home)
    good = body_of(payloads[:2]).encode()
    one = json.loads(body_of(payloads[:1]))["payloads"][0]
    auth = {"Authorization": f"Bearer {KEY}"}
    requests = [
        (dict(auth), good),                                              # 200
        ({}, good),                                                      # 401, no key
        ({"Authorization": "Bearer wrong"}, good),                       # 401
        ({**auth, "path": "/v1/models/nope/predict"}, good),             # 404
        (dict(auth), b"{not json"),                                      # 422 json
        (dict(auth), json.dumps({"payloads": [one] * 4}).encode()),      # 413 count
        (dict(auth), json.dumps({"payloads": [{**one, "text": "x"}]}).encode()),  # extra
        (dict(auth), json.dumps({"payloads": [{**one, "params": {"eta": 6.0}}]}).encode()),
        (dict(auth), json.dumps({"payloads": []}).encode()),             # 422 empty
    ]
    fast = _answers(home_dir, [(dict(h), b) for h, b in requests], True, monkeypatch)
    slow = _answers(home_dir, [(dict(h), b) for h, b in requests], False, monkeypatch)
    assert [a[0] for a in fast] == [200, 401, 401, 404, 422, 413, 422, 422, 422]
    for got, want in zip(fast, slow, strict=True):
        assert got == want
    assert fast[7][3]["type"] == "urn:privbert:problem:payload-mismatch"
    assert len(fast[0][3]["predictions"]) == 2
