"""End to end with the real `edge-agent` CLI against a real `cloud-api serve`: privatize and
post for predictions, fetch the bundle; and a tripwire: words privatized on the edge (and
the keys) appear in no log line of either server and nowhere under ``$PRIVBERT_HOME``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.cloud_api.conftest import cli_env
from tests.conftest import REPO

MARKERS = ["quetzalfrond", "zyxomantic", "plumbagorix"]


def edge(*args: str, key: str, cache: Path) -> subprocess.CompletedProcess:
    env = cli_env({"PRIVBERT_API_KEY": key, "PRIVBERT_CACHE": str(cache)})
    return subprocess.run([sys.executable, "-m", "edge_agent", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180)


def test_edge_privatizes_posts_and_gets_predictions(server, tmp_path):
    lines = ["a good film", "the plot was dull and boring", "great fun , love it"]
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(lines) + "\n")
    model = server.model("text")
    p = edge("privatize", str(inp), "--mechanism", "dchi-text", "--eta", "5", "--server",
             server.url, "--model", "text", "--post", "predict", "--no-progress",
             key=server.app_key, cache=tmp_path / "cache")
    assert p.returncode == 0, p.stderr
    preds = [json.loads(x) for x in p.stdout.splitlines()]
    assert [x["line"] for x in preds] == [1, 2, 3]
    assert all(set(x["scores"]) == set(model["labels"]) and x["label"] in model["labels"]
               for x in preds)
    assert "dchi-text" in p.stderr and "eta=5" in p.stderr  # the guarantee is printed


def test_edge_truncates_to_the_served_models_length(server, tmp_path):
    """A model trained at a shorter max_length than its bundle's: --post predict cuts a long
    text to the model's limit (the server would refuse it) and gets an answer."""
    from tests.cloud_api.conftest import EMB_MAX_LENGTH

    long_text = " ".join(["the movie was very good and the plot was fun"] * 4)
    inp = tmp_path / "in.txt"
    inp.write_text(long_text + "\n")
    p = edge("privatize", str(inp), "--mechanism", "dchi-embedding", "--eta", "5", "--server",
             server.url, "--model", "emb", "--post", "predict", "--no-progress",
             key=server.app_key, cache=tmp_path / "cache")
    assert p.returncode == 0, p.stderr
    assert [json.loads(x)["line"] for x in p.stdout.splitlines()] == [1]
    assert "1 truncated" in p.stderr
    assert server.model("emb")["max_length"] == EMB_MAX_LENGTH


def test_edge_refuses_other_parameters_before_sending(server, tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("a good film\n")
    p = edge("privatize", str(inp), "--mechanism", "dchi-text", "--eta", "7", "--server",
             server.url, "--model", "text", "--post", "predict", "--no-progress",
             key=server.app_key, cache=tmp_path / "cache")
    assert p.returncode != 0 and "eta" in p.stderr and "Traceback" not in p.stderr


def test_edge_bundle_fetch_downloads_once(server, tmp_path, tiny_bundle_of_home):
    cache = tmp_path / "cache"
    p = edge("bundle", "fetch", "--server", server.url, "--model", "emb", key=server.app_key,
             cache=cache)
    assert p.returncode == 0, p.stderr
    path = Path(p.stdout.strip())
    assert path == cache / tiny_bundle_of_home.bundle_id and (path / "bundle.json").is_file()
    again = edge("bundle", "fetch", "--server", server.url, "--model", "emb",
                 key=server.app_key, cache=cache)
    assert again.returncode == 0 and "already cached" in again.stderr
    bad = edge("bundle", "fetch", "--server", server.url, "--model", "emb", key="wrong",
               cache=tmp_path / "other")
    assert bad.returncode == 1 and "401" in bad.stderr


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_tripwire_no_marker_or_key_in_logs_or_home(server, tight_server, tiny_home, tmp_path):
    lines = [f"the {MARKERS[0]} movie was good", f"{MARKERS[1]} and {MARKERS[2]} , awful"]
    inp = tmp_path / "markers.txt"
    inp.write_text("\n".join(lines) + "\n")
    before = sum(ln.get("route") == "/v1/models/{model_id}/predict"
                 for ln in server.log_lines())
    p = edge("privatize", str(inp), "--mechanism", "dchi-embedding", "--eta", "5",
             "--server", server.url, "--model", "emb", "--post", "predict", "--no-progress",
             key=server.app_key, cache=tmp_path / "cache")
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 2
    # the same words in a malformed request: refused, and not echoed in the problem either
    bad = httpx.post(f"{server.url}/v1/models/emb/predict", headers=server.headers(),
                     json={"payloads": [{"mechanism": "dchi-embedding", "params": {
                         "eta": MARKERS[0]}, "bundle_id": MARKERS[1], "text": MARKERS[2]}]})
    assert bad.status_code == 422
    assert not any(m in bad.text for m in MARKERS)
    # the log did record these requests (a request's line is written once its answer is
    # sent, so the last one may still be on its way)
    deadline = time.monotonic() + 10
    while (after := sum(ln.get("route") == "/v1/models/{model_id}/predict"
                        for ln in server.log_lines())) < before + 2:
        assert time.monotonic() < deadline, (before, after)
        time.sleep(0.05)
    needles = [m.encode() for m in MARKERS]
    keys = [k.encode() for s in (server, tight_server) for ks in s.keys.values() for k in ks]
    haystacks = [server.log, tight_server.log, *_files(tiny_home.root)]
    assert len(haystacks) > 10
    for path in haystacks:
        data = path.read_bytes().lower()
        for needle in needles + [k.lower() for k in keys]:
            assert needle not in data, f"{needle[:6]!r}... found in {path}"
