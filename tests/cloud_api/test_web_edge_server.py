"""The web edge's command line (`privbert-edge`, Node) against a real `cloud-api serve`: the
model's bundle fetched and verified, payloads posted for predictions and as records, the
server answering them as it answers the Python edge's (the same seed gives the same payloads,
hence the same predictions); a server that is down, and a bundle whose hash does not match or
that is truncated, give one clear line, exit 1, and nothing is charged or sent."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.cloud_api.conftest import free_port
from tests.web_edge.conftest import _node_ready, js_edge, py_edge

MARKERS = ["quetzalfrond", "zyxomantic"]


@pytest.fixture(autouse=True)
def _needs_node():
    why = _node_ready()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def test_js_payloads_get_the_python_edges_predictions(server, tmp_path):
    lines = ["a good film", "the plot was dull and boring", f"great fun {MARKERS[0]}"]
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(lines) + "\n")
    key = {"PRIVBERT_API_KEY": server.app_key}
    args = ["privatize", str(inp), "--eta", "5", "--server", server.url, "--model", "text",
            "--post", "predict", "--seed", "9"]
    js = js_edge(*args, tmp=tmp_path, env=key)
    assert js.returncode == 0, js.stderr
    py = py_edge(*args, "--no-progress", tmp=tmp_path, env=key)
    assert py.returncode == 0, py.stderr
    model = server.model("text")
    preds = [json.loads(x) for x in js.stdout.splitlines()]
    assert [p["line"] for p in preds] == [1, 2, 3]
    assert all(p["label"] in model["labels"] and set(p["scores"]) == set(model["labels"])
               for p in preds)
    assert js.stdout == py.stdout  # same payloads, same answers
    assert f"of model text fetched and cached in {tmp_path / 'cache'}" in js.stderr
    # unseeded: OS entropy, still answered
    fresh = js_edge(*args[:-2], tmp=tmp_path, env=key)
    assert fresh.returncode == 0 and len(fresh.stdout.splitlines()) == 3
    assert "from cache" in fresh.stderr
    # the words stay on the device: none in the server's log
    log = server.log.read_text()
    assert not any(m in log for m in MARKERS)


def test_js_records_are_stored(server, tmp_path):
    inp = tmp_path / "in.tsv"
    model = server.model("text")
    inp.write_text(f"a good film\t{model['labels'][0]}\nthe plot was dull\t{model['labels'][-1]}\n")
    p = js_edge("privatize", str(inp), "--tsv", "--eta", "5", "--server", server.url, "--model",
                "text", "--post", "records", "--task", model.get("task") or "text",
                tmp=tmp_path, env={"PRIVBERT_API_KEY": server.app_key})
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in p.stdout.splitlines()]
    assert [r["line"] for r in rows] == [1, 2] and all(r["id"] for r in rows)


def test_other_parameters_are_refused_before_sending(server, tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("a good film\n")
    p = js_edge("privatize", str(inp), "--eta", "7", "--server", server.url, "--model", "text",
                "--post", "predict", tmp=tmp_path, env={"PRIVBERT_API_KEY": server.app_key})
    assert p.returncode == 1
    assert p.stderr.startswith('privbert-edge: error: model text reads dchi-text {"eta":5')
    assert not (tmp_path / "js-ledger.json").exists()


def test_a_server_that_is_down_is_one_line_and_nothing_is_charged(tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("a good film\n")
    url = f"http://127.0.0.1:{free_port()}"
    p = js_edge("privatize", str(inp), "--eta", "5", "--server", url, "--post", "predict",
                "--retries", "1", "--timeout", "5", tmp=tmp_path)
    assert p.returncode == 1
    assert p.stderr.startswith(f"privbert-edge: error: cannot reach {url}/v1/models (")
    assert p.stderr.rstrip().endswith("gave up after 2 attempts (check --server and that the "
                                      "service is running)")
    assert p.stdout == "" and not (tmp_path / "js-ledger.json").exists()


class _Stub(BaseHTTPRequestHandler):
    """A stand-in service that names a bundle and serves a damaged tarball of it; it counts
    what is posted to it (nothing may be)."""

    bundle_id = ""
    tarball = b""
    posts: list[str] = []

    def do_GET(self):  # noqa: N802
        if self.path == "/v1/models":
            body = json.dumps({"models": [{"id": "m", "mechanism": "dchi-text",
                                           "params": {"eta": 5.0}, "labels": ["0", "1"],
                                           "bundle_id": self.bundle_id}]}).encode()
            ctype = "application/json"
        elif self.path == f"/v1/bundles/{self.bundle_id}":
            body, ctype = self.tarball, "application/x-tar"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        _Stub.posts.append(self.path)
        self.send_error(500)

    def log_message(self, *args):
        pass


def _tampered(tar: bytes, how: str) -> bytes:
    if how == "truncated":
        return tar[: len(tar) // 2]
    src = tarfile.open(fileobj=io.BytesIO(tar))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name == "embeddings.npy":
                data = data[:-4] + b"\x00\x00\x80\x3f"  # one weight changed
            m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("how", ["wrong-hash", "truncated"])
def test_a_bundle_that_fails_verification_is_refused_and_nothing_is_sent(
        tiny_bundle_of_home, tmp_path, how):
    _Stub.bundle_id = tiny_bundle_of_home.bundle_id
    _Stub.tarball = _tampered(tiny_bundle_of_home.to_tar_bytes(), how)
    _Stub.posts = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        inp = tmp_path / "in.txt"
        inp.write_text("a good film\n")
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        p = js_edge("privatize", str(inp), "--eta", "5", "--server", url, "--post", "predict",
                    tmp=tmp_path)
    finally:
        srv.shutdown()
        srv.server_close()
    assert p.returncode == 1
    head = (f"privbert-edge: error: the bundle the server sent for "
            f"{tiny_bundle_of_home.bundle_id[:12]}… failed verification: bundle tarball")
    assert p.stderr.startswith(head), p.stderr
    want = ("/embeddings.npy: content does not match its hash" if how == "wrong-hash"
            else ": truncated or not a tar archive (no end-of-archive marker)")
    assert want in p.stderr
    assert _Stub.posts == []
    assert not (tmp_path / "cache" / tiny_bundle_of_home.bundle_id).exists()
    assert not (tmp_path / "js-ledger.json").exists()


SESSION_SCRIPT = """
import { EdgeSession, MemoryLedgerStore } from "./web_edge/dist/index.js";
const s = await EdgeSession.open({ server: process.env.URL, apiKey: process.env.KEY, model: "text",
  ledger: new MemoryLedgerStore() });
const texts = ["a good film", "the plot was dull", "a good film"];
const { sent, predictions } = await s.predict(texts);
const st = await s.status();
console.log(JSON.stringify({ sent, predictions, spent: st.spent, memoized: st.memoized,
  guarantee: s.guarantee }));
await s.close();
"""


def test_edge_session_privatizes_charges_and_predicts(server, tmp_path, tiny_bundle_of_home):
    """The library's one-call API for pages and scripts (EdgeSession), in Node."""
    from shared.ledger import bundle_diameter, payload_cost
    from shared.payload import parse_payload
    from tests.conftest import REPO

    p = subprocess.run(["node", "--input-type=module", "-e", SESSION_SCRIPT], cwd=REPO,
                       env={"PATH": os.environ["PATH"], "URL": server.url,
                            "KEY": server.app_key}, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    labels = server.model("text")["labels"]
    assert len(out["predictions"]) == 3 and all(x["label"] in labels for x in out["predictions"])
    sent = out["sent"]
    assert sent[0]["payload"] == sent[2]["payload"]  # the repeat is memoized: same payload
    assert sent[0]["cost"] is not None and sent[2]["cost"] is None  # and free
    assert all("good" not in s["payload"] and "film" not in s["payload"] for s in sent)
    d = bundle_diameter(tiny_bundle_of_home)
    want = sum(payload_cost(parse_payload(s["payload"]), d).epsilon for s in sent[:2])
    assert out["spent"] == pytest.approx(want, rel=1e-6)
    assert out["memoized"] == 2
    assert out["guarantee"]["worst_case"]["epsilon"] == pytest.approx(5.0 * d, rel=1e-6)
    assert all(isinstance(s["privatizedText"], str) and s["privatizedText"] for s in sent)
