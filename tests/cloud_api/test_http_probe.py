"""Requests a hostile but realistic client sends, against a real `cloud-api serve`: each
answer is a 4xx problem+json with a stable type (never a 5xx), and nothing already
accepted is lost or poisoned."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from cloud_api.auth import key_id
from shared.payload import make_payload
from tests.cloud_api.conftest import ETA, payloads_for

PROBLEM = "application/problem+json"


def assert_problem(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["type"] == f"urn:privbert:problem:{kind}" and body["status"] == status
    return body


def declare(server, name: str, mechanism: str, params: dict) -> None:
    bundle_id = server.model("text")["bundle_id"]
    r = httpx.post(f"{server.url}/admin/tasks", headers=server.headers(server.admin_key),
                   json={"task": name, "labels": ["neg", "pos"], "mechanism": mechanism,
                         "params": params, "bundle_id": bundle_id}, timeout=30)
    assert r.status_code in (200, 201), r.text


def task_summary(server, name: str) -> dict:
    r = httpx.get(f"{server.url}/admin/tasks", headers=server.headers(server.admin_key),
                  timeout=30)
    r.raise_for_status()
    return next(t for t in r.json()["tasks"] if t["task"] == name)


def post_records(server, task: str, payloads: list, labels: list,
                 key: str | None = None) -> httpx.Response:
    recs = [{"payload": json.loads(p.model_dump_json(exclude_none=True)), "label": y}
            for p, y in zip(payloads, labels, strict=True)]
    return httpx.post(f"{server.url}/v1/records", headers=server.headers(key),
                      json={"task": task, "records": recs}, timeout=60)


@pytest.mark.parametrize("where", ["query", "body"])
def test_deleting_an_id_beyond_64_bits_is_a_422_and_deletes_nothing(server,
                                                                    tiny_bundle_of_home,
                                                                    where):
    task = f"probe-del-{where}"
    declare(server, task, "dchi-text", {"eta": ETA})
    model = server.model("text")
    r = post_records(server, task, payloads_for(model, ["a good film"], tiny_bundle_of_home),
                     ["pos"])
    assert r.status_code == 201, r.text
    (kept,) = r.json()["ids"]
    url, hdrs = f"{server.url}/admin/records", server.headers(server.admin_key)
    for big in (2**63, 10**30):
        if where == "query":
            r = httpx.delete(url, params=[("ids", str(kept)), ("ids", str(big))],
                             headers=hdrs, timeout=30)
        else:
            r = httpx.request("DELETE", url, headers=hdrs, timeout=30,
                              content=json.dumps({"ids": [kept, big]}))
        body = assert_problem(r, 422, "validation")
        assert str(big) not in r.text and body["instance"] == r.headers["x-request-id"]
    assert task_summary(server, task)["records"] == 1  # the good id was not deleted either


def test_soft_labels_that_would_break_retraining_are_refused(server, tiny_bundle_of_home):
    """A soft label is TextHide's mix of k > 1 one-hot labels: on another task, or not a
    distribution, it used to be stored (201) and then failed every retraining job of the
    task ('a soft label must be non-negative and sum to 1')."""
    text_task, mix_task = "probe-soft-text", "probe-soft-mix"
    declare(server, text_task, "dchi-text", {"eta": ETA})
    texthide = {"m": 4, "k": 2}
    declare(server, mix_task, "texthide", texthide)
    bid = server.model("text")["bundle_id"]
    rng = np.random.default_rng(0)
    vectors = [make_payload("texthide", texthide, bid, rng.normal(size=16).astype(np.float32))
               for _ in range(2)]
    texts = payloads_for(server.model("text"), ["a good film", "dull"], tiny_bundle_of_home)

    r = post_records(server, text_task, texts, ["pos", [0.5, 0.5]])
    body = assert_problem(r, 422, "validation")
    assert "record 1" in body["detail"] and "TextHide" in body["detail"]
    for bad in ([0.5, 0.6], [-0.5, 1.5], [1e300, -1e300]):
        r = post_records(server, mix_task, vectors, [[0.25, 0.75], bad])
        body = assert_problem(r, 422, "validation")
        assert "record 1" in body["detail"] and "sum to 1" in body["detail"]
    assert task_summary(server, text_task)["records"] == 0
    assert task_summary(server, mix_task)["records"] == 0  # nothing of a refused request

    # the session server gives every key a cap (PRIVBERT_DEFAULT_BUDGET), and TextHide has no
    # epsilon, so no cap admits it: a key without a cap stores the valid request
    r = post_records(server, mix_task, vectors, [[0.25, 0.75], 1])
    assert_problem(r, 403, "budget-exhausted")
    uncapped = server.keys["app"][4]
    r = httpx.put(f"{server.url}/admin/budgets/{key_id(uncapped)}", json={"cap": None},
                  headers=server.headers(server.admin_key), timeout=30)
    assert r.status_code == 200, r.text
    r = post_records(server, mix_task, vectors, [[0.25, 0.75], 1], key=uncapped)
    assert r.status_code == 201, r.text
    got = task_summary(server, mix_task)
    assert got["records"] == 2 and got["soft"] == 1


def test_head_is_answered_like_get_without_a_body(server):
    """RFC 9110: a server supports HEAD wherever it supports GET (monitors and caches send
    it); it was a 405 on every route."""
    bid = server.model("text")["bundle_id"]
    for path, hdrs in [("/healthz", {}), ("/readyz", {}), ("/v1/models", server.headers()),
                       (f"/v1/bundles/{bid}", server.headers()),
                       ("/admin/tasks", server.headers(server.admin_key))]:
        get = httpx.get(f"{server.url}{path}", headers=hdrs, timeout=30)
        head = httpx.head(f"{server.url}{path}", headers=hdrs, timeout=30)
        assert get.status_code == head.status_code == 200, (path, head.status_code)
        assert head.content == b"" and head.headers["content-type"] == \
            get.headers["content-type"]
        assert head.headers["content-length"] == get.headers["content-length"]
    r = httpx.head(f"{server.url}/v1/models", timeout=30)  # still needs a key
    assert r.status_code == 401 and r.headers["content-type"] == PROBLEM and r.content == b""
    r = httpx.head(f"{server.url}/v1/records", headers=server.headers(), timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
