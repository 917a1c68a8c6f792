"""Server-side failures seen by the CLI (subprocess, in-test HTTP servers): TextHide models
trained with k > 1, a records upload that fails half-way, a server that is not privbert,
and a server error while stdin stays open."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.edge_agent.conftest import REPO, TEXTHIDE_KEY, assert_one_line_error, run_cli
from tests.edge_agent.test_server_paths import serve_model

HINT = "(is --server the URL of a privbert service?)"


def json_answer(obj, status: int = 200):
    return status, {"Content-Type": "application/json"}, json.dumps(obj).encode()


def problem(status: int, title: str, detail: str):
    return status, {"Content-Type": "application/problem+json"}, json.dumps(
        {"type": "https://privbert/errors/x", "title": title, "detail": detail}).encode()


def error_line(proc, code: int, contains: str) -> str:
    """The one error line, allowing the info line of a bundle fetched before the error."""
    kept = [ln for ln in proc.stderr.splitlines() if not ln.startswith("edge-agent: bundle ")]
    result = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout,
                                         "\n".join(kept) + "\n")
    return assert_one_line_error(result, code, contains)


def predict_ok(req):
    n = len(json.loads(req["body"])["payloads"])
    return json_answer({"predictions": [{"label": "pos", "scores": [0.4, 0.6]}] * n})


# -- 3. TextHide predictions use k = 1 whatever k the model was trained with ----------------------
def test_texthide_predict_compares_only_m(fake_server, tiny_enc_bundle, tmp_path):
    serve_model(fake_server, tiny_enc_bundle, mechanism="texthide", params={"m": 256, "k": 4})
    fake_server.routes[("POST", "/v1/models/m1/predict")] = predict_ok
    src = tmp_path / "in.txt"
    src.write_text("good movie\nbad plot\n")
    env = {"PRIVBERT_CACHE": str(tmp_path / "cache")}
    base = ["privatize", str(src), "--mechanism", "texthide", "--texthide-key", TEXTHIDE_KEY,
            "--server", fake_server.url, "--model", "m1", "--post", "predict"]
    proc = run_cli(*base, "--m", "256", env=env)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["line"] for x in proc.stdout.splitlines()] == [1, 2]
    sent = json.loads([r for r in fake_server.requests if r["method"] == "POST"][0]["body"])
    assert all(p["params"] == {"m": 256, "k": 1} for p in sent["payloads"])
    n_posts = sum(r["method"] == "POST" for r in fake_server.requests)
    proc = run_cli(*base, "--m", "128", env=env)  # another mask pool size is still refused
    assert_one_line_error(proc, 1, "model m1 reads texthide")
    assert sum(r["method"] == "POST" for r in fake_server.requests) == n_posts


# -- 4. a later request of one batch fails: the records stored before it are written ---------------
@pytest.mark.parametrize("post", ["records", "predict"])
def test_partial_post_keeps_what_the_server_accepted(fake_server, tiny_bundle, tmp_path, post):
    serve_model(fake_server, tiny_bundle)
    calls = []

    def records(req):
        calls.append(req)
        if len(calls) == 2:
            return problem(422, "Unprocessable Content", "record 2 of this request is bad")
        n = len(json.loads(req["body"])["records"])
        return json_answer({"ids": [f"r{len(calls)}-{i}" for i in range(n)]}, 201)

    def predict(req):
        calls.append(req)
        if len(calls) == 2:
            return problem(422, "Unprocessable Content", "payload 2 is bad")
        return predict_ok(req)

    route = ("POST", "/v1/records") if post == "records" else ("POST", "/v1/models/m1/predict")
    fake_server.routes[route] = records if post == "records" else predict
    src = tmp_path / "in.tsv"
    src.write_text("".join(f"line number {i}\t{i % 2}\n" for i in range(1, 11)))
    flags = (["--post", "records", "--task", "sst2"] if post == "records"
             else ["--post", "predict", "--model", "m1"])
    proc = run_cli("privatize", str(src), "--tsv", "--eta", "5", "--server", fake_server.url,
                   *flags, "--post-batch", "4", env={"PRIVBERT_CACHE": str(tmp_path / "cache")})
    line = error_line(proc, 1, "server answered 422")
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [o["line"] for o in out] == [1, 2, 3, 4]  # the first request's 4 lines
    if post == "records":
        assert [o["id"] for o in out] == ["r1-0", "r1-1", "r1-2", "r1-3"]
        assert "4 record(s) before it were uploaded and written" in line
    else:
        assert all(o["label"] == "pos" for o in out)
        assert "4 record(s) before it were written" in line
    assert len(calls) == 2  # nothing sent after the failure


# -- 7. --server pointing at an ordinary web server -----------------------------------------------
@pytest.fixture
def plain_web_server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "index.html").write_text("<!DOCTYPE HTML><html><body>hello</body></html>")
    handler = partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("command", ["privatize", "bundle-fetch"])
def test_wrong_server_says_what_to_do(plain_web_server, tmp_path, command):
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    env = {"PRIVBERT_CACHE": str(tmp_path / "cache")}
    if command == "privatize":
        proc = run_cli("privatize", str(src), "--eta", "5", "--server", plain_web_server,
                       env=env)
    else:
        proc = run_cli("bundle", "fetch", "--server", plain_web_server, "--id", "ab" * 32,
                       env=env)
    line = assert_one_line_error(proc, 1, "server answered 404")
    assert line.endswith(HINT)
    assert "<" not in line and "doctype" not in line.lower() and len(line) < 300


# -- a server error while stdin stays open ---------------------------------------------------------
def test_server_error_with_stdin_open_exits_promptly(fake_server, tiny_bundle, tmp_path):
    """401 from predict after the first batch: the process exits with the one-line error
    while the worker thread is blocked reading a pipe the test keeps open."""
    serve_model(fake_server, tiny_bundle)
    failed_at = []

    def predict(req):
        failed_at.append(time.monotonic())
        return problem(401, "Unauthorized", "unknown API key")

    fake_server.routes[("POST", "/v1/models/m1/predict")] = predict
    env = {**os.environ, "PYTHONPATH": str(REPO), "PRIVBERT_CACHE": str(tmp_path / "cache")}
    env.pop("EDGE_AGENT_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "edge_agent", "privatize", "-", "--eta", "5",
                             "--server", fake_server.url, "--model", "m1", "--post", "predict"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO, env=env)
    try:
        proc.stdin.write(b"good movie\n" * 20)  # one full first batch (16 lines) and more
        proc.stdin.flush()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("edge-agent did not exit after the server error while stdin is open")
        exited = time.monotonic()
        stderr = proc.stderr.read().decode()
        assert failed_at, stderr
        assert exited - failed_at[0] < 5, (exited - failed_at[0], stderr)
        result = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
        error_line(result, 1, "401 Unauthorized: unknown API key")
        assert proc.stdout.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()
        proc.wait()
