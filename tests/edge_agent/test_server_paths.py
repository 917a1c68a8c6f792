"""Bundle fetch/cache and --post against a tiny in-test HTTP server (the CLI in a subprocess)."""

from __future__ import annotations

import json

import httpx
import pytest

from edge_agent.service.bundle_cache import fetch_bundle
from edge_agent.service.client import PrivbertClient
from shared.bundle import BundleError, EdgeBundle
from shared.payload import parse_payload, parse_record
from tests.edge_agent.conftest import assert_one_line_error, run_cli


def serve_model(server, bundle, tar: bytes | None = None, mechanism="dchi-text",
                params=None) -> None:
    server.json_route("GET", "/v1/models", {"models": [{
        "id": "m1", "task": "sst2", "labels": ["negative", "positive"], "mechanism": mechanism,
        "params": params if params is not None else {"eta": 5.0},
        "bundle_id": bundle.bundle_id}]})
    server.routes[("GET", f"/v1/bundles/{bundle.bundle_id}")] = (
        200, {"Content-Type": "application/x-tar"},
        tar if tar is not None else bundle.to_tar_bytes())


def bundle_gets(server) -> int:
    return sum(r["path"].startswith("/v1/bundles/") for r in server.requests)


def test_bundle_fetch_caches_and_verifies(fake_server, tiny_enc_bundle, tmp_path):
    serve_model(fake_server, tiny_enc_bundle)
    env = {"PRIVBERT_CACHE": str(tmp_path / "cache")}
    proc = run_cli("bundle", "fetch", "--server", fake_server.url, "--model", "m1", env=env)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "cache" / tiny_enc_bundle.bundle_id
    assert proc.stdout.strip() == str(path)
    assert EdgeBundle.load(path, expected_id=tiny_enc_bundle.bundle_id).encoder_onnx
    assert bundle_gets(fake_server) == 1
    proc = run_cli("bundle", "fetch", "--server", fake_server.url, env=env)  # the only model
    assert proc.returncode == 0 and "already cached" in proc.stderr
    assert bundle_gets(fake_server) == 1  # not downloaded again
    info = run_cli("bundle", "info", str(path))
    assert json.loads(info.stdout)["bundle_id"] == tiny_enc_bundle.bundle_id


def test_corrupted_tarball_is_refused_and_not_cached(fake_server, tiny_enc_bundle, tmp_path):
    tar = bytearray(tiny_enc_bundle.to_tar_bytes())
    i = tar.find(b"NUMPY")  # flip a byte inside embeddings.npy
    tar[i + 200] ^= 0xFF
    serve_model(fake_server, tiny_enc_bundle, tar=bytes(tar))
    env = {"PRIVBERT_CACHE": str(tmp_path / "cache")}
    proc = run_cli("bundle", "fetch", "--server", fake_server.url, env=env)
    assert_one_line_error(proc, 1, "failed verification")
    assert "embeddings.npy" in proc.stderr
    assert not (tmp_path / "cache" / tiny_enc_bundle.bundle_id).exists()


def test_server_sends_another_bundle(fake_server, tiny_enc_bundle, tiny_bundle, tmp_path):
    serve_model(fake_server, tiny_enc_bundle, tar=tiny_bundle.to_tar_bytes())
    proc = run_cli("bundle", "fetch", "--server", fake_server.url,
                   env={"PRIVBERT_CACHE": str(tmp_path / "cache")})
    assert_one_line_error(proc, 1, "is not the expected")


def test_corrupted_cache_is_fetched_again(tiny_bundle, tmp_path):
    calls = []

    def handler(request):
        calls.append(request.url.path)
        return httpx.Response(200, content=tiny_bundle.to_tar_bytes())

    c = PrivbertClient("http://edge.test", transport=httpx.MockTransport(handler))
    b, path, fetched = fetch_bundle(c, tiny_bundle.bundle_id, root=tmp_path)
    assert fetched and b.bundle_id == tiny_bundle.bundle_id
    assert not fetch_bundle(c, tiny_bundle.bundle_id, root=tmp_path)[2]
    (path / "tokenizer.json").write_text("{}")  # damaged on disk
    b2, _, fetched = fetch_bundle(c, tiny_bundle.bundle_id, root=tmp_path)
    assert fetched and b2.bundle_id == tiny_bundle.bundle_id and len(calls) == 2
    with pytest.raises(BundleError, match="64 hex"):
        fetch_bundle(c, "../evil", root=tmp_path)


def test_post_predict_sends_only_payloads(fake_server, tiny_bundle, tmp_path):
    serve_model(fake_server, tiny_bundle)

    def predict(req):
        body = json.loads(req["body"])
        preds = [{"label": "positive", "scores": [0.3, 0.7]} for _ in body["payloads"]]
        return 200, {"Content-Type": "application/json"}, json.dumps(
            {"predictions": preds}).encode()

    fake_server.routes[("POST", "/v1/models/m1/predict")] = predict
    src = tmp_path / "in.txt"
    src.write_text("good movie zqxmarker\n\nbad plot secret\n" * 30)
    env = {"PRIVBERT_CACHE": str(tmp_path / "cache"), "PRIVBERT_API_KEY": "sekret"}
    proc = run_cli("privatize", str(src), "--eta", "5", "--server", fake_server.url, "--model",
                   "m1", "--post", "predict", "--post-batch", "16", env=env)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert len(out) == 60 and out[0] == {"line": 1, "label": "positive", "scores": [0.3, 0.7]}
    assert [o["line"] for o in out[:3]] == [1, 3, 4]  # line numbers of the input
    posts = [r for r in fake_server.requests if r["method"] == "POST"]
    assert all(len(json.loads(r["body"])["payloads"]) <= 16 for r in posts)
    assert all(r["headers"]["Authorization"] == "Bearer sekret" for r in posts)
    for r in posts:
        assert b"zqxmarker" not in r["body"] and b"good movie" not in r["body"]
        for p in json.loads(r["body"])["payloads"]:
            assert parse_payload(p).mechanism == "dchi-text"


def test_post_records_uploads_labelled_payloads(fake_server, tiny_bundle, tmp_path):
    serve_model(fake_server, tiny_bundle)

    def records(req):
        n = len(json.loads(req["body"])["records"])
        return 201, {"Content-Type": "application/json"}, json.dumps(
            {"ids": [f"r{len(fake_server.requests)}-{i}" for i in range(n)]}).encode()

    fake_server.routes[("POST", "/v1/records")] = records
    src = tmp_path / "in.tsv"
    src.write_text("sentence\tlabel\n" + "good movie\t1\nbad plot\t0\n" * 5)
    proc = run_cli("privatize", str(src), "--tsv", "--eta", "5", "--server", fake_server.url,
                   "--post", "records", "--task", "sst2", "--post-batch", "4",
                   env={"PRIVBERT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 10
    posts = [r for r in fake_server.requests if r["method"] == "POST"]
    keys = [r["headers"]["Idempotency-Key"] for r in posts]
    assert len(posts) >= 3 and len(set(keys)) == len(keys)
    for r in posts:
        body = json.loads(r["body"])
        assert body["task"] == "sst2"
        for rec in body["records"]:
            assert parse_record(rec).label in (0, 1)


def test_server_errors_are_one_line(fake_server, tiny_bundle, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    env = {"PRIVBERT_CACHE": str(tmp_path / "cache")}
    fake_server.routes[("GET", "/v1/models")] = (
        401, {"Content-Type": "application/problem+json"},
        json.dumps({"type": "https://privbert/errors/unauthorized", "title": "Unauthorized",
                    "detail": "missing API key"}).encode())
    proc = run_cli("privatize", str(src), "--eta", "5", "--server", fake_server.url, env=env)
    assert_one_line_error(proc, 1, "401 Unauthorized: missing API key")
    assert "--api-key" in proc.stderr
    proc = run_cli("privatize", str(src), "--eta", "5", "--server", "http://127.0.0.1:9",
                   "--retries", "1", "--timeout", "2", env=env)
    assert_one_line_error(proc, 1, "cannot reach http://127.0.0.1:9/v1/models")
    serve_model(fake_server, tiny_bundle, params={"eta": 50.0})
    proc = run_cli("privatize", str(src), "--eta", "5", "--server", fake_server.url, "--model",
                   "m1", "--post", "predict", env=env)
    assert_one_line_error(proc, 1, "model m1 reads dchi-text")
    assert not any(r["method"] == "POST" for r in fake_server.requests)
    proc = run_cli("privatize", str(src), "--eta", "5", "--server", fake_server.url, "--model",
                   "m2", env=env)
    assert_one_line_error(proc, 1, "no model 'm2'; it serves: m1")
