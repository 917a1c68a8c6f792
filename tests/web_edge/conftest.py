"""The web edge's command line (web_edge/, Node) as a subprocess, and the bundles it reads.

The tests run the real `privbert-edge` (node web_edge/bin/privbert-edge.js, built by
`npm ci` in web_edge/: scripts/test.sh does it) beside the real `edge-agent`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

WEB_EDGE = REPO / "web_edge"
CLI = WEB_EDGE / "bin" / "privbert-edge.js"


def _node_ready() -> str | None:
    """Why the web edge cannot run here (None: it can)."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (WEB_EDGE / "dist" / "node" / "cli.js").is_file():
        return "web_edge is not built: cd web_edge && npm ci (scripts/test.sh does it)"
    return None


@pytest.fixture(scope="session", autouse=True)
def _web_edge_built():
    why = _node_ready()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


def edge_env(tmp: Path, extra: dict | None = None) -> dict:
    """No PRIVBERT_* from the shell but the bundles the suite trusts (its tiny ones: the
    text floor refuses them at the η the tests use); the test's own ledger and caches."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PRIVBERT_") or k == "PRIVBERT_TRUSTED_BUNDLES"}
    env.update({"PYTHONPATH": str(REPO), "PRIVBERT_EDGE_LEDGER": str(tmp / "js-ledger.json"),
                "PRIVBERT_LEDGER": str(tmp / "py-ledger.sqlite3"),
                "PRIVBERT_CACHE": str(tmp / "cache"), "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra or {})
    return env


def js_edge(*args: str, tmp: Path, env: dict | None = None, timeout: float = 180,
            stdin: str | None = None) -> subprocess.CompletedProcess:
    """`privbert-edge ARGS` (text out)."""
    return subprocess.run(["node", str(CLI), *args], cwd=REPO, env=edge_env(tmp, env),
                          capture_output=True, text=True, timeout=timeout, input=stdin)


def py_edge(*args: str, tmp: Path, env: dict | None = None, timeout: float = 180
            ) -> subprocess.CompletedProcess:
    """`edge-agent ARGS` (text out)."""
    return subprocess.run([sys.executable, "-m", "edge_agent", *args], cwd=REPO,
                          env=edge_env(tmp, env), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def minilm_dir(minilm_bundle, tmp_path_factory) -> Path:
    """The MiniLM bundle saved as a bundle directory (what --bundle DIR reads)."""
    return minilm_bundle.save(tmp_path_factory.mktemp("minilm") / "bundle")


@pytest.fixture(scope="session")
def tiny_dir(tiny_bundle, tmp_path_factory) -> Path:
    """The tiny synthetic bundle (its privacy floor starts near eta 13) as a directory."""
    return tiny_bundle.save(tmp_path_factory.mktemp("tiny") / "bundle")


@pytest.fixture(scope="session")
def table_dirs(minilm_bundle, minilm_dir, tmp_path_factory) -> dict[str, Path]:
    """Bundle directories of every kind of privatization table (issue 33): the model's 384-d
    embeddings ("none"), its top 32 principal components in int8, its top 64 in float32."""
    from tests.conftest import trust_in_tests

    root = tmp_path_factory.mktemp("tables")
    out = {"none": minilm_dir}
    for name in ("pca32-int8", "pca64"):
        b = minilm_bundle.with_table(name)
        out[name] = b.save(root / name)
        # pca64 (float) is no bundle privbert ships, and at eta 65 beyond its matched eta:
        # the text floor would refuse it; these tests compare payloads, so it is trusted
        trust_in_tests(b)
    return out



@pytest.fixture(scope="session")
def policy_dir(table_dirs, tmp_path_factory) -> Path:
    """The pca32-int8 MiniLM bundle (the default table) with the token policy function-words
    (shared.policy, issue 41)."""
    from shared.bundle import EdgeBundle

    root = tmp_path_factory.mktemp("policy")
    return EdgeBundle.load(table_dirs["pca32-int8"]).with_policy("function-words").save(
        root / "bundle")
