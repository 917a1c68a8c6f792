"""A real `cloud-api serve` as one replica of several (PRIVBERT_MODEL_STORE=database,
PRIVBERT_RATE_LIMIT_STORE=database) on its own PostgreSQL cluster, with this test process
as the other replica and the job worker: its home starts empty and it shares nothing with
them but the database.

- ready only once the store was read and the promoted model is fetched, checked and loaded;
- a promotion written to the store is served within 10 s, a damaged one never;
- a key's rate limit is one bucket with the other replica;
- the database stopped: not ready (out of the Service), /healthz still 200; back by itself.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from cloud_api.auth import key_id
from cloud_api.store.db import Database
from cloud_api.store.model_store import ModelStore
from cloud_api.store.rate_limits import SharedRateLimiter
from cloud_api.store.tables import stored_files
from models.versions.manifest import MANIFEST_FILE, seal, verify_folder
from tests.cloud_api.conftest import ServerProcess, new_keys


def _until(what: str, check, seconds: float) -> float:
    """Seconds until ``check()`` is true (AssertionError naming ``what`` after ``seconds``)."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < seconds, f"{what} not within {seconds} s"
        time.sleep(0.1)
    return time.monotonic() - t0


def _copy_as_new_version(src: Path, dest: Path, marker: str) -> Path:
    """The same model, resealed with one harmless file changed: another version."""
    shutil.copytree(src, dest)
    (dest / MANIFEST_FILE).unlink()
    (dest / "provenance.txt").write_text(marker)
    seal(verify_folder(dest))
    return dest


@pytest.fixture
def cluster():
    from tests.pg import PgCluster, find_bin_dir

    if find_bin_dir() is None:
        pytest.skip("PostgreSQL server programs are not installed")
    c = PgCluster.create()
    c.start()
    yield c
    c.destroy()


def test_a_replica_follows_the_store_and_is_ready_only_with_its_database(
        tiny_home, cluster, tmp_path):
    db = Database(cluster.url(), connect_timeout_s=3.0)
    db.upgrade()
    store = ModelStore(db)
    home = tiny_home.root
    v1 = home / "models" / "text" / "versions" / tiny_home.promoted_at_start["text"]
    bundle_id = json.loads((v1 / "config.json").read_text())["bundle_id"]
    if (home / "bundles" / bundle_id).is_dir():
        store.put_bundle(bundle_id, home / "bundles" / bundle_id)
    store.put_version("text", "v1", v1, bundle_id=bundle_id)
    store.promote("text", "v1")

    keys = new_keys(app=2)
    srv = ServerProcess(tmp_path / "replica-home", tmp_path / "serve.log", keys, env={
        "PRIVBERT_DATABASE_URL": cluster.url(), "PRIVBERT_MODEL_STORE": "database",
        "PRIVBERT_RATE_LIMIT_STORE": "database", "PRIVBERT_RATE_LIMIT_PER_KEY": "0.001",
        "PRIVBERT_RATE_LIMIT_BURST": "1000", "PRIVBERT_MODEL_SYNC_INTERVAL_S": "0.5",
        "PRIVBERT_DB_CONNECT_TIMEOUT_S": "1", "PRIVBERT_READY_DB_TIMEOUT_S": "1",
        "PRIVBERT_WORKER_IN_SERVE": "0", "PRIVBERT_BACKEND": "onnx"}).start()
    admin = srv.headers(srv.admin_key)

    def served() -> str | None:
        models = httpx.get(f"{srv.url}/v1/models", headers=admin, timeout=5).json()["models"]
        return next((m["version"] for m in models if m["id"] == "text"), None)

    try:
        assert served() == "v1"  # fetched from the store into an empty home, checked, loaded
        assert (tmp_path / "replica-home" / "models" / "text" / "versions" / "v1"
                / MANIFEST_FILE).is_file()

        # a promotion by another replica (here: this process) is served within 10 s
        store.put_version("text", "v2", _copy_as_new_version(v1, tmp_path / "v2", "two"),
                          bundle_id=bundle_id)
        store.promote("text", "v2")
        _until("v2 served", lambda: served() == "v2", 10)

        # a damaged v3 in the store: refused, v2 keeps serving, /readyz says why
        store.put_version("text", "v3", _copy_as_new_version(v1, tmp_path / "v3", "three"),
                          bundle_id=bundle_id)
        with db.begin(write=True) as conn:
            conn.execute(update(stored_files).where(
                stored_files.c.folder == "models/text/v3",
                stored_files.c.path == "provenance.txt").values(data=b"tampered"))
        store.promote("text", "v3")
        ready = {}

        def says_why() -> bool:
            ready.update(httpx.get(f"{srv.url}/readyz", timeout=5).json())
            return "text (store)" in (ready.get("problems") or {})
        _until("/readyz naming the damaged v3", says_why, 10)
        assert ready["status"] == "ready" and "provenance.txt" in ready["problems"]["text (store)"]
        assert served() == "v2"

        # an admin's promotion through this replica of a version it never fetched: fetched,
        # checked, served, and written to the store for the others
        store.put_version("text", "v4", _copy_as_new_version(v1, tmp_path / "v4", "four"),
                          bundle_id=bundle_id)
        r = httpx.post(f"{srv.url}/admin/models/text/promote", headers=admin,
                       json={"version": "v4"}, timeout=60)
        assert r.status_code == 200, r.text
        assert served() == "v4" and store.promoted("text") == "v4"

        # one bucket per key for every replica: the other replica spends 999 of its 1000
        other = SharedRateLimiter(db, rate=0.001, burst=1000)
        assert other.acquire(key_id(keys["app"][1]), cost=999) == 0.0
        got = [httpx.get(f"{srv.url}/v1/models", headers=srv.headers(keys["app"][1]),
                         timeout=5).status_code for _ in range(3)]
        assert got == [200, 429, 429]

        # the database goes away: not ready, alive; it comes back: ready again by itself
        cluster.stop()
        _until("/readyz 503", lambda: httpx.get(f"{srv.url}/readyz", timeout=5)
               .status_code == 503, 10)
        assert httpx.get(f"{srv.url}/healthz", timeout=5).status_code == 200
        cluster.start()
        _until("/readyz 200 again", lambda: httpx.get(f"{srv.url}/readyz", timeout=5)
               .status_code == 200, 20)
    finally:
        srv.stop()
        db.dispose()
