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
from tests.conftest import REPO
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


README = REPO / "web_edge" / "README.md"
# Node has IndexedDB through fake-indexeddb (a dev dependency) and no Cache API: a CacheStorage
# kept in memory stands in for the browser's (the real one is in the browser test)
PLATFORM = """
import "fake-indexeddb/auto";
const stores = new Map();
globalThis.caches = { async open(name) {
  if (!stores.has(name)) {
    const m = new Map();
    stores.set(name, { async match(k) { return m.get(k)?.clone(); },
                       async put(k, r) { m.set(k, new Response(await r.arrayBuffer())); },
                       async delete(k) { return m.delete(k); } });
  }
  return stores.get(name);
} };
const apiKey = process.env.KEY;
const progress = [];
const showProgress = (p) => progress.push(p);
"""
AFTER = """
const again = await s.predict(["a sentence typed by the user", "the plot was dull"]);
const { CacheApiBundleCache } = await import("@privbert/edge");
console.log(JSON.stringify({ sent, predictions, again: again.sent, guarantee: s.guarantee, progress,
  labels: s.labels, status: await s.status(),
  cached: (await new CacheApiBundleCache().get(s.info.bundleId))?.bundleId }));
await s.close();
"""


def readme_example() -> str:
    """The code block of web_edge/README.md's "In a page or a script" section, as written."""
    text = README.read_text()
    start = text.index("## In a page or a script")
    block = text[text.index("```js\n", start) + 6 : text.index("```\n", text.index("```js\n", start) + 6)]
    code = [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("//")]
    assert len(code) == 7 and code[0].startswith("import {")  # import, open (3 lines), predict, 2
    return block


def test_the_readme_example_runs_against_a_real_server(server, tmp_path, tiny_bundle_of_home):
    """web_edge/README.md's lines for a page, run as written in Node (the server's URL and the
    model's id put in for the example's) against a real `cloud-api serve`: the bundle fetched,
    verified and cached, the privatizer at the model's η, the ledger charged before the
    payload leaves, a prediction; a memoized repeat is the same payload, free."""
    from shared.accounting import bundle_diameter
    from shared.ledger import payload_cost
    from shared.payload import parse_payload

    block = readme_example()
    assert '"https://api.example"' in block and 'model: "sst2"' in block
    assert 's.predict("a sentence typed by the user")' in block  # a string: a batch of one
    code = block.replace('"https://api.example"', "process.env.URL").replace('model: "sst2"', 'model: "text"')
    # run from web_edge/, where "@privbert/edge" is the package itself
    p = subprocess.run(["node", "--input-type=module", "-e", PLATFORM + code + AFTER],
                       cwd=REPO / "web_edge", env={"PATH": os.environ["PATH"], "URL": server.url,
                                                   "KEY": server.app_key},
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    labels = server.model("text")["labels"]
    assert len(out["predictions"]) == 1 and out["predictions"][0]["label"] in labels
    assert out["labels"] == labels  # the task's label names
    download = [p for p in out["progress"] if p["phase"] == "download"]
    assert download and download[-1]["loaded"] == download[-1]["total"]  # X-Bundle-Bytes
    assert [p["phase"] for p in out["progress"]][-2:] == ["verify", "prepare"]
    first, (repeat, other) = out["sent"][0], out["again"]
    assert parse_payload(first["payload"]).bundle_id == tiny_bundle_of_home.bundle_id
    assert "sentence" not in first["payload"] and "typed" not in first["payload"]
    assert out["cached"] == tiny_bundle_of_home.bundle_id  # verified and kept in the Cache API
    assert isinstance(first["privatizedText"], str) and first["privatizedText"]
    assert repeat["payload"] == first["payload"] and repeat["cost"] is None  # memoized: free
    assert first["cost"] is not None and other["cost"] is not None
    d = bundle_diameter(tiny_bundle_of_home)
    want = sum(payload_cost(parse_payload(x["payload"]), d).epsilon for x in (first, other))
    assert out["status"]["spent"] == pytest.approx(want, rel=1e-6)
    assert out["status"]["memoized"] == 2
    assert out["guarantee"]["worst_case"]["epsilon"] == pytest.approx(5.0 * d, rel=1e-6)


SESSION = """
import "fake-indexeddb/auto";
import { EdgeSession } from "@privbert/edge";
const [url, key] = [process.env.URL, process.env.KEY];
const caught = async (f) => { try { await f(); return null; } catch (e) {
  return { name: e.name, message: e.message, reason: e.reason ?? null, status: e.status ?? null }; } };
const long = Array(200).fill("good movie").join(" ");
const s = await EdgeSession.open({ server: url, apiKey: key, model: "text" });
const refused = await caught(() => s.predict(long));
const before = await s.status();
const t = await EdgeSession.open({ server: url, apiKey: key, model: "text", truncate: "first" });
const cut = await t.predict(long);
const one = await s.predict("a good film");
console.log(JSON.stringify({ refused, sendsBefore: before.sends, cut: cut.sent[0].tokens,
  cutLabel: cut.predictions[0].label, one: one.predictions.length, maxLength: s.info.maxLength,
  notStrings: await caught(() => s.predict([1, 2])),
  badTruncate: await caught(() => EdgeSession.open({ server: url, apiKey: key, truncate: "cut" })),
  wrongKey: await caught(() => EdgeSession.open({ server: url, apiKey: "not-a-key", model: "text" })),
  noKey: await caught(() => EdgeSession.open({ server: url, model: "text" })) }));
await s.close();
await t.close();
"""


def test_a_session_takes_a_string_refuses_a_long_text_and_words_errors_for_a_page(server):
    """EdgeSession in Node against a real service: a string is a batch of one; a text past
    the model's length is refused unless truncate is "first" (nothing charged); a wrong or
    missing key is said in a web developer's words (no CLI flags)."""
    p = subprocess.run(["node", "--input-type=module", "-e", SESSION], cwd=REPO / "web_edge",
                       env={"PATH": os.environ["PATH"], "URL": server.url, "KEY": server.app_key},
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["refused"]["name"] == "TextError" and out["refused"]["reason"] == "too_long"
    assert out["sendsBefore"] == 0  # refused before anything was charged
    assert out["cut"] == out["maxLength"] - 2 and out["cutLabel"] in server.model("text")["labels"]
    assert out["one"] == 1
    assert out["notStrings"]["name"] == "TypeError" and "string" in out["notStrings"]["message"]
    assert out["badTruncate"]["name"] == "RangeError"
    for k, hint in (("wrongKey", "does not know this API key"), ("noKey", "no API key was given")):
        err = out[k]
        assert err["name"] == "ApiError" and err["status"] == 401 and hint in err["message"], err
        assert "--api-key" not in err["message"] and "apiKey" in err["message"]
