"""Versions that cannot be laundered, and the server's small findings of issue 42.

A version's manifest is written when it is made and its own SHA-256 recorded in the
database when it is sealed (``version_seals``): a manifest deleted or rewritten in the folder
is refused, NaN in any array file (``posterior.npz`` included) is refused, resealing is an
explicit admin command that says what it seals, and a real `cloud-api serve` that starts on
a laundered promoted version serves the last version that verifies and says so (log and
``privbert_model_fallback_total``). Through the same server: ``POST /admin/tasks`` for
``dchi-embedding`` on a bundle with a designed table only is a 422 (it was a 500), a
parameter that differs past the 6th digit is shown with its digits, and a keys file in
UTF-16 stops the server in one line naming ``PRIVBERT_KEYS_FILE``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from cloud_api.errors import InvalidRequest
from cloud_api.home import ModelHome
from cloud_api.store.db import Database
from cloud_api.store.seals import DatabaseSeals
from models.versions.manifest import (
    MANIFEST_FILE,
    IntegrityError,
    manifest_sha256,
    seal,
    verify_folder,
)
from shared.payload import make_payload
from tests.cloud_api.conftest import ServerProcess, cloud_api, new_keys

ETA = 4.0
PROBLEM = "application/problem+json"


def nan_posterior() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, log_posterior=np.array([[0.0, np.nan]], dtype=np.float32))
    return buf.getvalue()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A home with its database (the server's default, ``privbert.db`` in the home) and
    model ``m``: v1 and v2 of a tiny dchi-text classifier, v2 promoted; a designed-table
    bundle of the same model beside the model's own."""
    import torch

    from cloud_api.serving.bundles import BundleStore
    from models.nets.backbone import load_bert
    from models.nets.classifiers import build_classifier
    from models.versions.model_version import save_model_version
    from shared.bundle import EdgeBundle
    from tests.conftest import make_full_tiny_bert

    tmp = tmp_path_factory.mktemp("laundered")
    bert_dir = make_full_tiny_bert(tmp / "bert")
    b = EdgeBundle.from_model(bert_dir)
    root = tmp / "home"
    root.mkdir(exist_ok=True)
    db = Database(f"sqlite:///{root / 'privbert.db'}")
    db.prepare()
    home = ModelHome(root, seals=DatabaseSeals(db)).ensure()
    store = BundleStore(home)
    store.add(b)
    table_only = b.with_table("pca4-int8")
    store.add(table_only)
    cfg = {"kind": "tokens", "mechanism": "dchi-text", "params": {"eta": ETA},
           "bundle_id": b.bundle_id, "special_ids": b.special_ids, "labels": ["neg", "pos"],
           "max_length": 32, "task": "m"}
    torch.manual_seed(0)
    src = save_model_version(tmp / "src", build_classifier("dchi-text", 2,
                             bert=load_bert(bert_dir)), cfg, {}, {})
    for _ in range(2):
        home.promote("m", home.register("m", src))
    return home, db, b, table_only, src, tmp


def test_a_version_is_sealed_when_made_and_its_digest_recorded(made):
    home, db, _, _, src, _ = made
    assert verify_folder(src).sealed  # cloud-api train's folder has its manifest
    for v in ("v1", "v2"):
        assert DatabaseSeals(db).get("m", v) == manifest_sha256(home.version_dir("m", v))


def test_a_deleted_or_forged_manifest_is_refused(made, tmp_path):
    home, db, b, *_ = made
    v = home.version_dir("m", home.register("m", made[4]))
    version = v.name
    manifest = (v / MANIFEST_FILE).read_bytes()
    try:
        # deleted, and a finite edit: it used to be sealed afresh and served
        (v / MANIFEST_FILE).unlink()
        cfg = json.loads((v / "config.json").read_text())
        (v / "config.json").write_text(json.dumps({**cfg, "labels": ["pos", "neg"]}))
        with pytest.raises(InvalidRequest, match="manifest.json is missing, but the version "
                                                 "was sealed with a manifest of SHA-256"):
            home.verify("m", version)
        assert not (v / MANIFEST_FILE).exists()  # nothing was sealed
        with pytest.raises(InvalidRequest, match="manifest.json is missing"):
            home.promote("m", version)
        # forged: a manifest that matches the edited files
        seal(verify_folder(v))
        with pytest.raises(InvalidRequest, match="is not the one sealed .* a forged or "
                                                 "replaced manifest"):
            home.verify("m", version)
        # a NaN posterior under a forged manifest: refused the same way, and never resealed
        (v / "posterior.npz").write_bytes(nan_posterior())
        seal(_forge(v))
        with pytest.raises(InvalidRequest, match="not the one sealed"):
            home.verify("m", version)
        r = cloud_api("models", "reseal", "m", version, "--home", str(home.root))
        assert r.returncode == 2, r.stderr
        assert "posterior.npz: array log_posterior holds NaN" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        # an admin's reseal after an intended change: says what it seals, and it serves
        (v / "posterior.npz").unlink()
        r = cloud_api("models", "reseal", "m", version, "--home", str(home.root))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.strip().splitlines()
        assert lines[-1].startswith(f"resealed m {version}: ") and "recorded in the database" \
            in lines[-1]
        assert any(line.endswith("  config.json") for line in lines)
        assert home.verify("m", version).sealed
        assert DatabaseSeals(db).get("m", version) == manifest_sha256(v)
    finally:
        (v / MANIFEST_FILE).write_bytes(manifest)


def _forge(v: Path):
    """What a launderer writes: the manifest of the folder as it is now (no check)."""
    from models.versions.manifest import Verified, file_sha256, folder_files

    return Verified(v, {n: file_sha256(v / n) for n in folder_files(v)}, sealed=False)


def test_nan_in_any_array_file_is_refused_when_made_and_when_sealed(made, tmp_path):
    from models.nets.backbone import load_bert
    from models.nets.classifiers import build_classifier
    from models.versions.model_version import save_model_version

    home, _, b, _, src, tmp = made
    cfg = json.loads((src / "config.json").read_text())
    with pytest.raises(IntegrityError, match="posterior.npz: array log_posterior holds NaN"):
        save_model_version(tmp_path / "nan", build_classifier(
            "dchi-text", 2, bert=load_bert(tmp / "bert")), cfg, {}, {},
            extra_files={"posterior.npz": nan_posterior()})
    assert not (tmp_path / "nan").exists()
    # a NaN posterior added to a sealed folder: a file the manifest does not list
    v = home.version_dir("m", "v1")
    (v / "posterior.npz").write_bytes(nan_posterior())
    try:
        with pytest.raises(InvalidRequest, match="posterior.npz is not in manifest.json"):
            home.verify("m", "v1")
    finally:
        (v / "posterior.npz").unlink()
    assert home.verify("m", "v1").sealed


def test_a_nan_sealed_into_a_manifest_is_still_refused(made, tmp_path):
    """A manifest that lists a NaN posterior (sealed by a writer that did not check, with no
    record to compare: a home without its database) is refused for the NaN itself."""
    import shutil

    v = tmp_path / "v"
    shutil.copytree(made[4], v)
    (v / "posterior.npz").write_bytes(nan_posterior())
    seal(_forge(v))
    with pytest.raises(IntegrityError, match="posterior.npz: array log_posterior holds NaN"):
        verify_folder(v)


@pytest.fixture(scope="module")
def srv(made):
    """A real server started on the home with v2 laundered (its manifest deleted, a finite
    edit): it must serve v1."""
    home, _, _, _, _, tmp = made
    v2 = home.version_dir("m", "v2")
    (v2 / MANIFEST_FILE).unlink()
    cfg = json.loads((v2 / "config.json").read_text())
    (v2 / "config.json").write_text(json.dumps({**cfg, "labels": ["pos", "neg"]}))
    s = ServerProcess(home.root, tmp / "serve.log", new_keys(), {
        "PRIVBERT_BACKEND": "torch", "PRIVBERT_WORKER_IN_SERVE": "0",
        "PRIVBERT_ALLOW_WEAK_PRIVACY": "1"})
    s.start()
    yield s
    s.stop()


def test_a_restart_on_a_laundered_promoted_version_serves_the_last_verified(srv, made):
    home = made[0]
    assert home.promoted("m") == "v2"
    assert srv.model("m")["version"] == "v1"
    assert srv.metric("privbert_model_fallback_total", model="m", version="v1") == 1
    line = srv.wait_log(lambda ln: "serving v1, the last version that verifies" in
                        ln.get("message", ""))[0]["message"]
    assert "the promoted v2 cannot be served" in line and "manifest.json is missing" in line
    ready = httpx.get(f"{srv.url}/readyz", timeout=10)
    assert ready.status_code == 200
    assert "v2 failed to load" in ready.json()["problems"]["m"]
    assert "serving v1" in ready.json()["problems"]["m"]


def test_admin_tasks_for_embeddings_on_a_table_only_bundle_is_a_422(srv, made):
    table_only = made[3]
    r = httpx.post(f"{srv.url}/admin/tasks", headers=srv.headers(srv.admin_key), timeout=60,
                   json={"task": "emb", "labels": ["neg", "pos"], "mechanism": "dchi-embedding",
                         "params": {"eta": ETA}, "bundle_id": table_only.bundle_id})
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, r.text
    detail = r.json()["detail"]
    assert "cannot serve dchi-embedding" in detail and "export-bundle --table none" in detail
    assert "make-bundle" not in detail and "\n" not in detail


def test_a_parameter_past_the_sixth_digit_is_shown_with_its_digits(srv, made):
    b = made[2]
    eta = ETA * (1 + 1e-8)  # outside the parameters' tolerance, the same in %g
    p = make_payload("dchi-text", {"eta": eta}, b.bundle_id, np.array([5, 6], np.int64))
    r = httpx.post(f"{srv.url}/v1/models/m/predict", timeout=60,
                   headers={**srv.headers(), "Content-Type": "application/json"},
                   content='{"payloads":[' + p.model_dump_json(exclude_none=True) + "]}")
    assert r.status_code == 422, r.text
    assert f"eta {eta!r} sent, model serves eta 4.0" in r.json()["detail"]


def test_a_utf16_keys_file_is_one_line_naming_the_variable(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("admin " + new_keys()["admin"][0] + "\n", encoding="utf-16")
    r = cloud_api("serve", "--port", "0", env={"PRIVBERT_HOME": str(tmp_path / "home"),
                                               "PRIVBERT_KEYS_FILE": str(keys)}, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert "PRIVBERT_KEYS_FILE" in lines[0] and "not UTF-8" in lines[0]
