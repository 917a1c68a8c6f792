"""A bundle with a designed privatization table (shared.table), end to end with the real
commands: `cloud-api export-bundle --table`, `cloud-api train --table` (the version carries
its bundle), `cloud-api models register`, `cloud-api evaluate`, a real `cloud-api serve`,
and the real `edge-agent` fetching the compact bundle and getting predictions on it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import httpx
import pytest

from shared.bundle import EdgeBundle
from shared.table import table_digest
from tests.cloud_api.conftest import ServerProcess, cli_env, cloud_api, new_keys
from tests.conftest import REPO

TABLE = "pca8-int8"
ETA = 5.0


@pytest.fixture(scope="module")
def trained(tiny_home, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("table")
    out = root / "m"
    p = cloud_api("train", "--data", str(tiny_home.data), "--dev", str(tiny_home.dev),
                  "--mechanism", "dchi-text", "--eta", str(ETA), "--table", TABLE,
                  "--base", str(tiny_home.base), "--epochs", "1", "--device", "cpu",
                  "--no-progress", "--out", str(out), timeout=600)
    assert p.returncode == 0, p.stderr
    return {"root": root, "out": out, "stderr": p.stderr}


def test_train_keeps_the_bundle_it_made(trained, tiny_home):
    cfg = json.loads((trained["out"] / "config.json").read_text())
    b = EdgeBundle.load(trained["out"] / "bundle", expected_id=cfg["bundle_id"])
    assert not b.has_embeddings and b.table_name == TABLE and b.table_dim == 8
    # the projection was fitted on the base model's own word table
    assert b.table_info["source"]["sha256"] == \
        table_digest(EdgeBundle.from_model(tiny_home.base).embeddings)
    assert "table pca8-int8" in trained["stderr"]


def test_export_bundle_with_a_table(tiny_home, tmp_path):
    p = cloud_api("export-bundle", "--table", TABLE, "--model-dir", str(tiny_home.base),
                  "--out", str(tmp_path / "b"))
    assert p.returncode == 0, p.stderr
    b = EdgeBundle.load(tmp_path / "b")
    assert f"bundle_id={b.bundle_id}" in p.stdout and "serves dchi-text only" in p.stdout
    assert not (tmp_path / "b" / "embeddings.npy").exists()
    bad = cloud_api("export-bundle", "--table", "pcax", "--out", str(tmp_path / "c"))
    assert bad.returncode == 2 and "unknown table" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_evaluate_finds_the_versions_bundle(trained, tiny_home):
    p = cloud_api("evaluate", "--model", str(trained["out"]), "--data", str(tiny_home.dev),
                  "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert "accuracy" in p.stdout


def test_dchi_embedding_is_refused_on_a_table_bundle(tiny_home, tmp_path):
    p = cloud_api("train", "--data", str(tiny_home.data), "--mechanism", "dchi-embedding",
                  "--eta", str(ETA), "--table", TABLE, "--base", str(tiny_home.base),
                  "--epochs", "1", "--device", "cpu", "--out", str(tmp_path / "e"))
    assert p.returncode == 2, p.stderr
    assert "dchi-text only" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "e").exists()


def test_served_and_privatized_over_the_table(trained, tiny_home, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(trained["out"], tmp_path / "m")
    reg = cloud_api("models", "register", "--model-id", "tab", str(tmp_path / "m"), "--promote",
                    "--home", str(home))
    assert reg.returncode == 0, reg.stderr
    assert "warning" not in reg.stderr  # the version's own bundle went into the home
    keys = new_keys()
    server = ServerProcess(home, tmp_path / "serve.log", keys).start()
    try:
        model = next(m for m in httpx.get(f"{server.url}/v1/models", headers=server.headers(),
                                          timeout=10).json()["models"] if m["id"] == "tab")
        tar = httpx.get(f"{server.url}/v1/bundles/{model['bundle_id']}",
                        headers=server.headers(), timeout=10)
        assert tar.status_code == 200
        assert EdgeBundle.from_tar_bytes(tar.content).table_name == TABLE
        inp = tmp_path / "in.txt"
        inp.write_text("a good film\nthe plot was dull\n")
        cache = tmp_path / "cache"
        p = subprocess.run(
            [sys.executable, "-m", "edge_agent", "privatize", str(inp), "--mechanism",
             "dchi-text", "--eta", str(ETA), "--server", server.url, "--model", "tab",
             "--post", "predict", "--no-progress"], cwd=REPO, capture_output=True, text=True,
            env=cli_env({"PRIVBERT_API_KEY": server.app_key, "PRIVBERT_CACHE": str(cache)}),
            timeout=180)
        assert p.returncode == 0, p.stderr
        assert [json.loads(x)["line"] for x in p.stdout.splitlines()] == [1, 2]
        assert (cache / model["bundle_id"] / "table.npy").is_file()
        assert not (cache / model["bundle_id"] / "embeddings.npy").exists()
        assert "table pca8-int8" in p.stderr  # the report says which table it used
    finally:
        server.stop()
