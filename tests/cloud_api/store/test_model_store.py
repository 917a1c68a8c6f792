"""The shared model store (cloud_api/store/model_store.py, stored_home.py) on a real
PostgreSQL: two homes stand for two replicas that share no folder, only the database.

A version is stored whole or not at all, fetched and checked against its manifest before a
replica points at it; a corrupt or half-written one is refused and the previous version stays;
version numbers are unique across hosts; `import-home` is idempotent."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import select, update

from cloud_api.errors import Conflict, NotFound
from cloud_api.home import ModelHome
from cloud_api.store.db import Database
from cloud_api.store.model_store import CHUNK, ModelStore, StoreIntegrityError
from cloud_api.store.stored_home import StoredHome
from cloud_api.store.tables import model_versions, stored_files
from models.versions.manifest import seal, verify_folder
from tests.cloud_api.conftest import REPO, cli_env


@pytest.fixture
def pg(fresh_postgres_url):
    db = Database(fresh_postgres_url, connect_timeout_s=5.0)
    db.upgrade()
    yield db
    db.dispose()


def make_version(path: Path, text: str, *, big: bool = False, bundle_id: str | None = None
                 ) -> Path:
    """A sealed folder that registers as a version: config.json, weights-like files."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"text": text, "bundle_id": bundle_id}))
    (path / "sub").mkdir()
    (path / "sub" / "notes.txt").write_text(text * 3)
    (path / "empty.bin").write_bytes(b"")
    if big:  # more than one chunk
        (path / "big.bin").write_bytes(bytes(range(256)) * (CHUNK // 256 + 7))
    seal(verify_folder(path))
    return path


def test_versions_are_stored_whole_fetched_checked_and_idempotent(pg, tmp_path):
    store = ModelStore(pg)
    src = make_version(tmp_path / "src", "one", big=True)
    assert store.reserve("m") == "v1"
    assert store.versions("m") == []  # a reserved number is not a version
    assert store.put_version("m", "v1", src) is True
    assert store.put_version("m", "v1", src) is False  # the same again: nothing to do
    other = make_version(tmp_path / "other", "two")
    with pytest.raises(Conflict):
        store.put_version("m", "v1", other)
    [v] = store.versions("m")
    assert (v.version, v.files) == ("v1", 5)
    dest = tmp_path / "fetched"
    store.fetch_version("m", "v1", dest)
    for name in ("config.json", "sub/notes.txt", "empty.bin", "big.bin", "manifest.json"):
        assert (dest / name).read_bytes() == (src / name).read_bytes(), name
    with pytest.raises(NotFound):
        store.fetch_version("m", "v2", tmp_path / "none")
    assert store.reserve("m") == "v2"  # after v1, whoever asks


def test_a_corrupt_stored_file_or_manifest_is_refused(pg, tmp_path):
    store = ModelStore(pg)
    store.put_version("m", "v1", make_version(tmp_path / "src", "one"))
    with pg.begin(write=True) as conn:  # a byte changed in the database
        conn.execute(update(stored_files).where(stored_files.c.path == "sub/notes.txt")
                     .values(data=b"tampered"))
    with pytest.raises(StoreIntegrityError, match="notes.txt does not match"):
        store.fetch_version("m", "v1", tmp_path / "a")
    with pg.begin(write=True) as conn:  # the manifest itself rewritten to match
        conn.execute(update(model_versions).values(manifest_sha256="0" * 64))
    with pytest.raises(StoreIntegrityError, match="does not match the digest recorded"):
        store.fetch_version("m", "v1", tmp_path / "b")


def test_two_replicas_share_versions_and_promotions_without_a_shared_folder(pg, tmp_path):
    a = StoredHome(tmp_path / "a", ModelStore(pg)).ensure()
    b = StoredHome(tmp_path / "b", ModelStore(pg)).ensure()
    assert isinstance(a, StoredHome) and isinstance(b, StoredHome)
    v1 = a.register("m", make_version(tmp_path / "s1", "one"))
    a.promote("m", v1)
    assert b.promoted_all() == {}  # b has fetched nothing yet
    report = b.sync()
    assert report.changed == {"m": "v1"} and not report.failed
    assert b.promoted_all() == {"m": "v1"}
    assert json.loads((b.version_dir("m", "v1") / "config.json").read_text())["text"] == "one"
    assert b.sync().changed == {}  # nothing new: one small query

    # b registers next (its own number from the store), a stores v3 after it
    v2 = b.register("m", make_version(tmp_path / "s2", "two"))
    v3 = a.register("m", make_version(tmp_path / "s3", "three"))
    assert (v2, v3) == ("v2", "v3")
    assert a.versions("m") == b.versions("m") == ["v1", "v2", "v3"]

    # v3's bytes are damaged in the store before b fetches it: b keeps v1, says why
    with pg.begin(write=True) as conn:
        conn.execute(update(stored_files).where(stored_files.c.folder == "models/m/v3",
                                                stored_files.c.path == "sub/notes.txt")
                     .values(data=b"x"))
    a.promote("m", v3)  # a has its own good copy
    report = b.sync()
    assert report.changed == {} and "notes.txt does not match" in report.failed["m"]
    assert b.promoted_all() == {"m": "v1"}
    assert not (b.version_dir("m", "v3") / "config.json").exists()  # nothing half-written
    assert [p.name for p in b.version_dir("m", "v1").parent.iterdir()
            if p.name.startswith(".")] == []  # the fetch folder was removed

    a.promote("m", v2)  # a good one again: b follows, fetching v2
    assert b.sync().changed == {"m": "v2"}
    assert b.promoted("m") == "v2" and b.promoted_all() == {"m": "v2"}


def test_version_numbers_are_unique_across_hosts(pg, tmp_path):
    homes = [StoredHome(tmp_path / f"h{i}", ModelStore(pg)).ensure() for i in range(3)]
    got: list[str] = []
    errors: list[BaseException] = []

    def reserve(home: StoredHome) -> None:
        try:
            for _ in range(4):
                got.append(home.reserve_version("m")[0])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reserve, args=(h,)) for h in homes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(got, key=lambda v: int(v[1:])) == [f"v{i}" for i in range(1, 13)]


def test_import_home_is_one_idempotent_command_and_bases_follow(pg, tmp_path, tiny_bundle):
    home = ModelHome(tmp_path / "home").ensure()
    bundle_dir = tiny_bundle.save(home.bundle_dir(tiny_bundle.bundle_id))
    assert bundle_dir.is_dir()
    base = home.base_dir("tiny")
    base.mkdir(parents=True)
    (base / "config.json").write_text('{"model_type": "bert"}')  # unsealed, as a user's
    home.register("m", make_version(tmp_path / "s1", "one", bundle_id=tiny_bundle.bundle_id))
    v2 = home.register("m", make_version(tmp_path / "s2", "two"))
    home.promote("m", v2)
    env = cli_env({"PRIVBERT_HOME": str(home.root),
                   "PRIVBERT_DATABASE_URL": pg.url.render_as_string(hide_password=False)})
    runs = [subprocess.run([sys.executable, "-m", "cloud_api.cli", "store", "import-home"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    assert "m v1: imported" in runs[0].stdout and "m: promoted v2 in the store" in runs[0].stdout
    assert "base tiny: imported" in runs[0].stdout
    assert "base tiny: already in the store" in runs[1].stdout
    assert "m v1: already in the store" in runs[1].stdout
    assert "promoted v2 in the store" not in runs[1].stdout
    store = ModelStore(pg)
    assert [v.version for v in store.versions("m")] == ["v1", "v2"]
    assert store.promotions()["m"].serial == 1  # the second run promoted nothing
    assert store.has_bundle(tiny_bundle.bundle_id)
    # a replica gets the version and its bundle, both checked
    replica = StoredHome(tmp_path / "replica", store).ensure()
    replica.materialize("m", "v1")
    assert replica.base_dir("tiny") / "config.json" == replica.root / "bases" / "tiny" / \
        "config.json"
    assert (replica.root / "bases" / "tiny" / "manifest.json").is_file()  # sealed, checked
    assert not replica.base_dir("other").exists()  # a free name stays free
    # a base a pretraining job publishes on one host is there for the others
    made = replica.root / "bases" / "made"
    made.mkdir()
    (made / "config.json").write_text("{}")
    replica.publish_base("made")
    other = StoredHome(tmp_path / "other", store).ensure()
    assert json.loads((other.base_dir("made") / "config.json").read_text()) == {}
    assert (replica.bundle_dir(tiny_bundle.bundle_id) / "bundle.json").is_file()
    with pg.begin() as conn:  # the home's folder names and bytes, as stored
        assert conn.execute(select(model_versions.c.version).where(
            model_versions.c.bundle_id == tiny_bundle.bundle_id)).scalars().all() == ["v1"]
