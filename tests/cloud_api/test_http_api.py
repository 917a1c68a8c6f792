"""The HTTP API of a real `cloud-api serve`: health, discovery, predict, bundles, errors, docs."""

from __future__ import annotations

import io
import math
import tarfile

import httpx
import numpy as np
import pytest

from cloud_api.errors import problem_type
from shared.payload import make_payload
from tests.cloud_api.conftest import body_of, payloads_for

PROBLEM = "application/problem+json"


def assert_problem(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["type"] == problem_type(kind), body
    assert body["status"] == status and body["title"] and body["detail"]
    assert body["instance"] == r.headers["x-request-id"]
    return body


def test_health_ready_metrics_are_open(server):
    assert httpx.get(f"{server.url}/healthz").json()["status"] == "ok"
    r = httpx.get(f"{server.url}/readyz")
    assert r.status_code == 200 and r.json()["status"] == "ready"
    m = httpx.get(f"{server.url}/metrics")
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    assert 'privbert_model_loaded{model="text"' in m.text


def test_models_describe_what_the_edge_needs(server, tiny_bundle_of_home):
    r = httpx.get(f"{server.url}/v1/models", headers=server.headers())
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    models = {m["id"]: m for m in r.json()["models"]}
    assert set(models) == {"text", "emb"}
    text = models["text"]
    assert text["mechanism"] == "dchi-text" and text["params"] == {"eta": 5.0}
    assert text["labels"] == ["neg", "pos"] and text["bundle_id"] == tiny_bundle_of_home.bundle_id
    assert text["version"].startswith("v") and text["max_length"] == 128
    assert text["guarantee"]["nominal"]["eta"] == 5.0 and "accuracy" in text["metrics"]


def test_predict_answers_each_payload_with_label_scores_and_version(server,
                                                                   tiny_bundle_of_home):
    model = server.model("emb")
    payloads = payloads_for(model, ["a good film", "the plot was dull and boring", "fun"],
                            tiny_bundle_of_home)
    r = httpx.post(f"{server.url}/v1/models/emb/predict", content=body_of(payloads),
                   headers={**server.headers(), "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model_id"] == "emb" and out["version"] == model["version"]
    assert len(out["predictions"]) == 3
    for p in out["predictions"]:
        assert set(p["scores"]) == {"neg", "pos"}
        assert math.isclose(sum(p["scores"].values()), 1.0, rel_tol=1e-5)
        assert p["label"] == max(p["scores"], key=p["scores"].get)


def _dchi_text(bundle_id: str, ids, eta: float = 5.0) -> dict:
    return make_payload("dchi-text", {"eta": eta}, bundle_id, np.asarray(ids)).model_dump(
        mode="json", exclude_none=True)


def _post(server, model_id: str, body, **kw) -> httpx.Response:
    kw = {"json": body} if not isinstance(body, str | bytes) else {"content": body}
    return httpx.post(f"{server.url}/v1/models/{model_id}/predict", headers=server.headers(),
                      **kw)


def test_payload_for_another_eta_bundle_or_mechanism_is_a_422_naming_it(server,
                                                                        tiny_bundle_of_home):
    bid = tiny_bundle_of_home.bundle_id
    ids = [10, 11, 12]
    d = assert_problem(_post(server, "text", {"payloads": [_dchi_text(bid, ids, 60.0)]}),
                       422, "payload-mismatch")["detail"]
    assert "eta 60" in d and "eta 5" in d
    d = assert_problem(_post(server, "text", {"payloads": [_dchi_text("ab" * 32, ids)]}),
                       422, "payload-mismatch")["detail"]
    assert "bundle" in d
    emb = make_payload("dchi-embedding", {"eta": 5.0}, bid,
                       np.zeros((2, 16), np.float32)).model_dump(mode="json")
    d = assert_problem(_post(server, "text", {"payloads": [emb]}), 422,
                       "payload-mismatch")["detail"]
    assert "dchi-embedding" in d and "dchi-text" in d


def test_nan_wrong_dtype_shape_and_ids_out_of_range_are_422(server, tiny_bundle_of_home):
    bid = tiny_bundle_of_home.bundle_id
    emb = make_payload("dchi-embedding", {"eta": 5.0}, bid,
                       np.ones((2, 16), np.float32)).model_dump(mode="json")
    nan = dict(emb, embeddings=dict(emb["embeddings"]))
    raw = np.ones((2, 16), "<f4")
    raw[1, 3] = np.nan
    import base64

    nan["embeddings"]["data"] = base64.b64encode(raw.tobytes()).decode()
    assert_problem(_post(server, "emb", {"payloads": [nan]}), 422, "validation")
    wrong_dim = make_payload("dchi-embedding", {"eta": 5.0}, bid,
                             np.ones((2, 8), np.float32)).model_dump(mode="json")
    assert_problem(_post(server, "emb", {"payloads": [wrong_dim]}), 422, "validation")
    wrong_dtype = dict(emb, embeddings=dict(emb["embeddings"], dtype="int32"))
    assert_problem(_post(server, "emb", {"payloads": [wrong_dtype]}), 422, "validation")
    vocab = tiny_bundle_of_home.vocab_size
    body = assert_problem(_post(server, "text", {"payloads": [_dchi_text(bid, [vocab + 5])]}),
                          422, "validation")
    assert body["errors"] and all("input" not in e for e in body["errors"])
    cls = tiny_bundle_of_home.special_ids["cls"]  # a special id is not a regular token
    assert_problem(_post(server, "text", {"payloads": [_dchi_text(bid, [cls, 10])]}), 422,
                   "payload-mismatch")


@pytest.mark.parametrize("body, where", [
    (b"{not json", "JSON"), (b"", "JSON"), (b"[]", ""), (b'{"payloads": []}', "payloads"),
    (b'{"payloads": [{"mechanism": "dchi-text"}], "text": "x"}', ""),
])
def test_malformed_bodies_are_422_problems(server, body, where):
    d = assert_problem(_post(server, "text", body), 422, "validation")["detail"]
    assert where in d


def test_unknown_model_route_and_method_are_problems(server, tiny_bundle_of_home):
    bid = tiny_bundle_of_home.bundle_id
    assert_problem(_post(server, "nope", {"payloads": [_dchi_text(bid, [10])]}), 404,
                   "not-found")
    assert_problem(httpx.get(f"{server.url}/v2/whatever"), 404, "not-found")
    r = httpx.delete(f"{server.url}/v1/models", headers=server.headers())
    assert_problem(r, 405, "method-not-allowed")
    assert r.headers["allow"] == "GET"
    assert_problem(httpx.get(f"{server.url}/v1/bundles/xyz", headers=server.headers()),
                   422, "validation")
    assert_problem(httpx.get(f"{server.url}/v1/bundles/{'0' * 64}", headers=server.headers()),
                   404, "not-found")


def test_bundle_tarball_with_etag_and_304(server, tiny_bundle_of_home):
    bid = tiny_bundle_of_home.bundle_id
    url = f"{server.url}/v1/bundles/{bid}"
    r = httpx.get(url, headers=server.headers())
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-tar"
    assert r.headers["etag"] == f'"{bid}"'
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        names = {m.name.split("/")[-1] for m in tar.getmembers()}
    assert {"bundle.json", "tokenizer.json", "embeddings.npy"} <= names
    r304 = httpx.get(url, headers={**server.headers(), "If-None-Match": f'W/"x", "{bid}"'})
    assert r304.status_code == 304 and r304.content == b"" and r304.headers["etag"] == f'"{bid}"'
    other = httpx.get(url, headers={**server.headers(), "If-None-Match": '"other"'})
    assert other.status_code == 200


def test_request_id_is_echoed_or_generated(server):
    r = httpx.get(f"{server.url}/v1/models", headers={**server.headers(),
                                                       "X-Request-ID": "edge-42.a"})
    assert r.headers["x-request-id"] == "edge-42.a"
    r = httpx.get(f"{server.url}/v1/models", headers={**server.headers(),
                                                       "X-Request-ID": "bad id\twith tab"})
    assert r.headers["x-request-id"] != "bad id\twith tab" and len(r.headers["x-request-id"]) == 32
    bad = httpx.get(f"{server.url}/nope", headers={"X-Request-ID": "trace-7"})
    assert bad.json()["instance"] == "trace-7"


def test_openapi_documents_every_route_with_problem_schemas(server):
    doc = httpx.get(f"{server.url}/openapi.json").json()
    ops = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert {("/healthz", "get"), ("/readyz", "get"), ("/metrics", "get"),
            ("/v1/models", "get"), ("/v1/models/{model_id}/predict", "post"),
            ("/v1/bundles/{bundle_id}", "get"),
            ("/admin/models/{model_id}/promote", "post")} <= ops
    schemas = doc["components"]["schemas"]
    assert {"Problem", "PredictRequest", "PredictResponse", "DChiTextPayload"} <= set(schemas)
    predict = doc["paths"]["/v1/models/{model_id}/predict"]["post"]
    body = predict["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body.endswith("/PredictRequest")
    for status in ("401", "403", "404", "413", "422", "429", "503"):
        ref = predict["responses"][status]["content"][PROBLEM]["schema"]["$ref"]
        assert ref.endswith("/Problem")
    assert "Retry-After" in predict["responses"]["429"]["headers"]
    assert predict["security"] == [{"bearer": []}]
    assert httpx.get(f"{server.url}/docs").status_code == 200


def test_log_lines_are_json_with_request_fields_and_no_keys(server):
    rid = "log-check-1"
    httpx.get(f"{server.url}/v1/models", headers={**server.headers(), "X-Request-ID": rid})
    from cloud_api.auth import key_id

    # json.loads of every line (all are JSON); the access line follows the answer
    mine = server.wait_log(lambda ln: ln.get("request_id") == rid)
    assert mine and mine[0]["route"] == "/v1/models" and mine[0]["status"] == 200
    assert mine[0]["key_id"] == key_id(server.app_key) and mine[0]["duration_ms"] >= 0
    text = server.log.read_text()
    assert server.app_key not in text and server.admin_key not in text
