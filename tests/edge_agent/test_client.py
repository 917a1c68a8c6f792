"""The HTTP client against httpx.MockTransport: batching, retries, auth, problem+json."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from edge_agent.service.client import ApiError, PrivbertClient
from shared.payload import Record, make_payload

BUNDLE = "ab" * 32


def payloads(n: int) -> list:
    return [make_payload("dchi-text", {"eta": 10.0}, BUNDLE, np.arange(1, 4) + i)
            for i in range(n)]


def client(handler, **kw) -> tuple[PrivbertClient, list[float]]:
    sleeps: list[float] = []
    c = PrivbertClient("http://edge.test", kw.pop("api_key", "k3y"),
                       transport=httpx.MockTransport(handler), sleep=sleeps.append, **kw)
    return c, sleeps


def predict_ok(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    return httpx.Response(200, json={"predictions": [{"label": 1, "scores": [0.2, 0.8]}
                                                     for _ in body["payloads"]]})


def test_batching_splits_requests_and_sends_auth():
    seen = []

    def handler(request):
        seen.append(request)
        return predict_ok(request)

    c, _ = client(handler, batch_size=4)
    preds = c.predict("m1", payloads(10))
    assert len(preds) == 10 and preds[0] == {"label": 1, "scores": [0.2, 0.8]}
    sizes = [len(json.loads(r.content)["payloads"]) for r in seen]
    assert sizes == [4, 4, 2]
    assert all(r.url.path == "/v1/models/m1/predict" for r in seen)
    assert all(r.headers["Authorization"] == "Bearer k3y" for r in seen)
    sent = json.loads(seen[0].content)["payloads"][0]
    assert sent["mechanism"] == "dchi-text" and sent["bundle_id"] == BUNDLE


def test_api_key_from_environment(monkeypatch):
    monkeypatch.setenv("PRIVBERT_API_KEY", "from-env")
    seen = []
    c = PrivbertClient("http://edge.test", transport=httpx.MockTransport(
        lambda r: seen.append(r) or httpx.Response(200, json={"models": []})))
    c.models()
    assert seen[0].headers["Authorization"] == "Bearer from-env"


@pytest.mark.parametrize("status", [429, 503])
def test_retries_then_success(status):
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) <= 2:
            return httpx.Response(status, headers={"Retry-After": "3"} if len(calls) == 2
                                  else {}, json={"title": "busy"})
        return predict_ok(request)

    c, sleeps = client(handler, backoff=0.5)
    assert len(c.predict("m1", payloads(2))) == 2
    assert len(calls) == 3
    assert 0.25 <= sleeps[0] <= 0.5 and sleeps[1] == 3.0  # jittered backoff, then Retry-After


def test_connection_errors_retried_with_growing_backoff():
    calls = []

    def handler(request):
        calls.append(1)
        if len(calls) <= 3:
            raise httpx.ConnectError("connection refused", request=request)
        return predict_ok(request)

    c, sleeps = client(handler, backoff=1.0)
    assert len(c.predict("m1", payloads(1))) == 1
    assert len(sleeps) == 3 and sleeps[0] <= 1.0 < sleeps[2] <= 4.0


def test_gives_up_after_retries_with_a_clear_error():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(503, json={"type": "https://privbert/errors/overloaded",
                                         "title": "Service Unavailable", "detail": "queue full"})

    c, sleeps = client(handler, retries=3)
    with pytest.raises(ApiError) as exc:
        c.predict("m1", payloads(1))
    assert len(calls) == 4 and len(sleeps) == 3
    msg = str(exc.value)
    assert "503" in msg and "queue full" in msg and "gave up after 4 attempts" in msg


def test_unreachable_server():
    def handler(request):
        raise httpx.ConnectError("connection refused", request=request)

    c, _ = client(handler, retries=1)
    with pytest.raises(ApiError, match=r"cannot reach http://edge.test/v1/models .*gave up after"):
        c.models()


def test_401_is_not_retried_and_says_what_to_do():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(401, headers={"Content-Type": "application/problem+json"},
                              json={"type": "https://privbert/errors/unauthorized",
                                    "title": "Unauthorized", "detail": "unknown API key"})

    c, _ = client(handler)
    with pytest.raises(ApiError) as exc:
        c.models()
    assert len(calls) == 1
    e = exc.value
    assert e.status == 401 and e.title == "Unauthorized" and e.detail == "unknown API key"
    assert e.type == "https://privbert/errors/unauthorized"
    assert "--api-key" in str(e) and "PRIVBERT_API_KEY" in str(e)


def test_problem_detail_surfaces():
    def handler(request):
        return httpx.Response(422, headers={"Content-Type": "application/problem+json"},
                              json={"type": "https://privbert/errors/bundle-mismatch",
                                    "title": "Unprocessable Content",
                                    "detail": "payload bundle_id does not match model m1"})

    c, _ = client(handler)
    with pytest.raises(ApiError, match="bundle_id does not match model m1") as exc:
        c.predict("m1", payloads(1))
    assert exc.value.status == 422 and exc.value.type.endswith("bundle-mismatch")


def test_records_idempotency_key_kept_across_retries():
    seen = []

    def handler(request):
        seen.append(request)
        if len(seen) == 2:
            return httpx.Response(503)
        n = len(json.loads(request.content)["records"])
        return httpx.Response(201, json={"ids": list(range(n))})

    c, _ = client(handler, batch_size=3)
    recs = [Record(payload=p, label=i % 2) for i, p in enumerate(payloads(5))]
    ids = c.post_records("sst2", recs, idempotency_key="run1")
    assert len(ids) == 5
    keys = [r.headers["Idempotency-Key"] for r in seen]
    assert keys == ["run1-0", "run1-1", "run1-1"]  # the retry reuses its batch's key
    body = json.loads(seen[0].content)
    assert body["task"] == "sst2" and [r["label"] for r in body["records"]] == [0, 1, 0]
    # without a key, each batch gets a fresh random one
    seen.clear()
    c.post_records("sst2", recs)
    auto = [r.headers["Idempotency-Key"] for r in seen]
    assert len(set(auto)) == 2 and auto[0].endswith("-0")


def test_bad_arguments_and_answers():
    with pytest.raises(ValueError, match="http"):
        PrivbertClient("edge.test")
    c, _ = client(lambda r: httpx.Response(200, json={"predictions": []}))
    with pytest.raises(ApiError, match="expected 2 predictions"):
        c.predict("m1", payloads(2))
    c, _ = client(lambda r: httpx.Response(200, text="<html>hi</html>"))
    with pytest.raises(ApiError, match="not JSON"):
        c.models()
    with pytest.raises(ApiError, match="not a bundle id"):
        c.bundle_bytes("../../etc/passwd")


def test_failed_upload_carries_the_ids_stored_before_it():
    """A later request of one call fails: ``partial`` holds what the server stored."""
    seen = []

    def handler(request):
        seen.append(request)
        if len(seen) == 2:
            return httpx.Response(422, headers={"Content-Type": "application/problem+json"},
                                  json={"title": "Unprocessable Content", "detail": "bad"})
        n = len(json.loads(request.content)["records"])
        return httpx.Response(201, json={"ids": [f"id{len(seen)}-{i}" for i in range(n)]})

    c, _ = client(handler, batch_size=3)
    recs = [Record(payload=p, label=1) for p in payloads(8)]
    with pytest.raises(ApiError) as exc:
        c.post_records("sst2", recs)
    assert exc.value.partial == ["id1-0", "id1-1", "id1-2"] and len(seen) == 2
    seen.clear()

    def predict(request):
        seen.append(request)
        return predict_ok(request) if len(seen) == 1 else httpx.Response(401, json={})

    c, _ = client(predict, batch_size=2)
    with pytest.raises(ApiError) as exc:
        c.predict("m1", payloads(5))
    assert len(exc.value.partial) == 2 and exc.value.status == 401


HINT = "(is --server the URL of a privbert service?)"
HTML = "<!DOCTYPE HTML>\n<html><head><title>Error response</title></head><body>" + "x" * 500


@pytest.mark.parametrize(("status", "headers", "body", "hint"), [
    (404, {"Content-Type": "text/html;charset=utf-8"}, HTML, True),  # python -m http.server
    (404, {"Content-Type": "application/json"}, '{"detail": "Not Found"}', True),  # FastAPI
    (404, {"Content-Type": "application/problem+json"},
     '{"title": "Not Found", "detail": "no route"}', True),  # /v1/models never 404s
    (500, {"Content-Type": "text/plain"}, "oops " * 100, True),
    (401, {"Content-Type": "application/problem+json"},
     '{"title": "Unauthorized", "detail": "unknown API key"}', False),  # privbert speaking
])
def test_not_a_privbert_service_models(status, headers, body, hint):
    c, _ = client(lambda r: httpx.Response(status, headers=headers, content=body.encode()))
    with pytest.raises(ApiError) as exc:
        c.models()
    msg = str(exc.value)
    assert msg.endswith(HINT) == hint, msg
    assert "<" not in msg and "DOCTYPE" not in msg and len(msg) < 300


def test_not_a_privbert_service_bundles_and_answers():
    html = {"Content-Type": "text/html"}
    c, _ = client(lambda r: httpx.Response(404, headers=html, content=HTML.encode()))
    with pytest.raises(ApiError, match=r"an HTML page.*privbert service\?\)$"):
        c.bundle_bytes("ab" * 32)
    problem = {"Content-Type": "application/problem+json"}
    c, _ = client(lambda r: httpx.Response(404, headers=problem, json={
        "title": "Not Found", "detail": "no bundle ab…"}))
    with pytest.raises(ApiError) as exc:  # the service itself: its message is enough
        c.bundle_bytes("ab" * 32)
    assert HINT not in str(exc.value) and "no bundle" in str(exc.value)
    c, _ = client(lambda r: httpx.Response(200, headers=html, content=HTML.encode()))
    with pytest.raises(ApiError) as exc:
        c.models()
    assert str(exc.value).endswith(HINT) and "<" not in str(exc.value)
    c, _ = client(lambda r: httpx.Response(200, json={"hello": "world"}))
    with pytest.raises(ApiError, match="no list of models"):
        c.models()
    # predict is not discovery: a plain error there gets no hint, but no HTML either
    c, _ = client(lambda r: httpx.Response(502, headers=html, content=HTML.encode()))
    with pytest.raises(ApiError) as exc:
        c.predict("m1", payloads(1))
    assert HINT not in str(exc.value) and "an HTML page" in str(exc.value)
