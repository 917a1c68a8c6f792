"""Adding a mechanism is one file plus one registry line: a toy mechanism that the product
does not have (``tests/toy_mechanism.py``, k-ary randomized response on word pieces, which
imports only public names) is registered by the entry point of a test-only distribution --
the plugin hook of ``shared.mechanisms.registry``, which reads installed distributions only
-- and then works through the real `cloud-api bootstrap` (its flags from the toy's
``Params``, the floor, the privatization of the training text, fine-tuning, the ONNX export,
the version, the task), the real `edge-agent privatize` (its flags, its payloads, the device
ledger) and a real `cloud-api serve` prediction (the payload union, the model's contract,
the budget). No file of the product and no copied configuration is edited.

The model is trained on the session's tiny BERT and sentiment TSV; the server runs on the
onnx backend (no torch start).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cloud_api.conftest import ServerProcess, cli_env, new_keys
from tests.conftest import REPO

EPSILON = 2.0  # keeps 7.4/(7.4 + V - 1) of the tiny vocabulary's tokens: above the floor


def install_plugin(root: Path) -> Path:
    """A folder for PYTHONPATH holding the dist-info of a distribution whose entry point
    registers the toy mechanism (what `pip install` of such a package leaves)."""
    info = root / "privbert_toy_mechanism-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: privbert-toy-mechanism\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(
        "[privbert.mechanisms]\ntoy-rr = tests.toy_mechanism:ToyRR\n")
    return root


def edge(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_agent", *args], cwd=REPO,
                          env=cli_env(env), capture_output=True, text=True, timeout=180)


@pytest.fixture
def toy_server(tiny_home, tmp_path):
    plugin = install_plugin(tmp_path / "plugin")
    path = f"{REPO}:{plugin}"
    home = tmp_path / "home"
    boot = subprocess.run(
        [sys.executable, "-m", "cloud_api.cli", "bootstrap", "--data", str(tiny_home.data),
         "--dev", str(tiny_home.dev), "--mechanism", "toy-rr", "--epsilon", str(EPSILON),
         "--epochs", "1", "--limit", "32", "--dev-draws", "0", "--base", str(tiny_home.base),
         "--model-id", "toy", "--home", str(home), "--device", "cpu", "--no-progress"],
        cwd=REPO, env=cli_env({"PYTHONPATH": path, "PRIVBERT_BACKEND": "onnx"}),
        capture_output=True, text=True, timeout=600)
    assert boot.returncode == 0, boot.stderr[-3000:]
    assert 'mechanism=toy-rr params={"epsilon": 2.0}' in boot.stdout
    assert "task=toy declared" in boot.stdout
    srv = ServerProcess(home, tmp_path / "serve.log", new_keys(), env={
        "PYTHONPATH": path, "PRIVBERT_BACKEND": "onnx", "PRIVBERT_WORKER_IN_SERVE": "0"})
    srv.start()
    try:
        yield srv, path
    finally:
        srv.stop()


def test_a_registered_toy_mechanism_goes_through_the_edge_and_the_server(toy_server, tmp_path):
    srv, path = toy_server
    inp = tmp_path / "in.txt"
    inp.write_text("a good fun movie\nan awful dull plot\n")
    env = {"PYTHONPATH": path, "PRIVBERT_API_KEY": srv.app_key,
           "PRIVBERT_CACHE": str(tmp_path / "cache"),
           "PRIVBERT_LEDGER": str(tmp_path / "ledger.sqlite3")}
    model = srv.model("toy")
    assert (model["mechanism"], model["params"]) == ("toy-rr", {"epsilon": EPSILON})

    out = tmp_path / "out.jsonl"
    p = edge("privatize", str(inp), "--mechanism", "toy-rr", "--epsilon", str(EPSILON),
             "--server", srv.url, "--model", "toy", "--no-progress", "-o", str(out), env=env)
    assert p.returncode == 0, p.stderr
    payloads = [json.loads(x)["payload"] for x in out.read_text().splitlines()]
    assert [(q["mechanism"], q["params"]) for q in payloads] == [("toy-rr",
                                                                   {"epsilon": EPSILON})] * 2
    assert "toy-rr: published eps=2" in p.stderr  # its guarantee, through the object

    p = edge("privatize", str(inp), "--mechanism", "toy-rr", "--epsilon", str(EPSILON),
             "--server", srv.url, "--model", "toy", "--post", "predict", "--no-progress",
             env=env)
    assert p.returncode == 0, p.stderr
    preds = [json.loads(x) for x in p.stdout.splitlines()]
    assert [x["line"] for x in preds] == [1, 2]
    assert all(x["label"] in model["labels"] for x in preds)

    # its flags are its own, and its cost went to the device ledger (n tokens x epsilon)
    p = edge("privatize", str(inp), "--mechanism", "toy-rr", "--eta", "5", "--server",
             srv.url, "--model", "toy", env=env)
    assert p.returncode == 2 and "--eta do(es) not apply to --mechanism toy-rr" in p.stderr
    p = edge("budget", "--json", env=env)
    assert p.returncode == 0, p.stderr
    spent = json.loads(p.stdout)["families"]["randomized-response"]
    tokens = sum(q["token_ids"]["shape"][0] for q in payloads)  # the second run: memoized
    assert spent["epsilon"] == pytest.approx(EPSILON * tokens) and spent["tokens"] == tokens

    # without the plugin the CLI does not know the mechanism
    p = edge("privatize", str(inp), "--mechanism", "toy-rr", "--epsilon", "2",
             env={**env, "PYTHONPATH": str(REPO)})
    assert p.returncode == 2 and "invalid choice: 'toy-rr'" in p.stderr
