"""Model versions, promotions and edge bundles in the database, for replicas that share no
writable volume (``PRIVBERT_MODEL_STORE=database``; docs/deployment.md says why the
database and not an object store).

    store = ModelStore(db)
    version = store.reserve("sst2")                      # "v4": unique across every host
    store.put_version("sst2", version, folder)           # a sealed folder, in one transaction
    store.promote("sst2", version)                       # the promotion row, serial + 1
    store.promotions()                                   # {"sst2": Promotion("v4", 17)}
    store.fetch_version("sst2", "v4", dest)              # files into dest, checked whole

A version is whole or absent: its files and the SHA-256 of its manifest are written in one
transaction, and only a version with that digest is listed, fetched or promoted. A fetch
writes into a folder the caller then renames, and checks the manifest's digest and every
file against the manifest (``models.versions.manifest``) before it returns, so a reader never sees a
half-written or altered version (:class:`StoreIntegrityError` otherwise). Bundles are
content-addressed and checked against their id (``shared.bundle``) the same way.
Knows nothing of the web framework; works on PostgreSQL and SQLite alike.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError as SQLIntegrityError

from cloud_api.errors import Conflict, NotFound
from cloud_api.store.db import Database
from cloud_api.store.tables import (
    model_promotions,
    model_versions,
    stored_bases,
    stored_bundles,
    stored_files,
)
from models.versions.manifest import MANIFEST_FILE, IntegrityError, folder_files, verify_folder
from shared.bundle import EdgeBundle

CHUNK = 4 << 20  # bytes per stored_files row


class StoreIntegrityError(IntegrityError):
    """What came out of the store is not what was put in (a manifest digest or a file that
    does not match); nothing of it is used."""


@dataclass(frozen=True)
class Promotion:
    version: str
    serial: int


@dataclass(frozen=True)
class StoredVersion:
    model_id: str
    version: str
    manifest_sha256: str
    files: int
    bytes: int
    bundle_id: str | None


def version_folder(model_id: str, version: str) -> str:
    return f"models/{model_id}/{version}"


def bundle_folder(bundle_id: str) -> str:
    return f"bundles/{bundle_id}"


def base_folder(name: str) -> str:
    return f"bases/{name}"


def _number(version: str) -> int:
    if not version.startswith("v") or not version[1:].isdigit():
        raise ValueError(f"not a version name: {version!r}")
    return int(version[1:])


def _chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        first = True
        while True:
            block = fh.read(CHUNK)
            if not block and not first:
                return
            yield block  # an empty file is one empty chunk
            first = False
            if len(block) < CHUNK:
                return


class ModelStore:
    """The tables of ``0007_shared_models`` behind one :class:`Database`; thread-safe."""

    def __init__(self, db: Database):
        self.db = db

    # -- versions ----------------------------------------------------------------------------
    def reserve(self, model_id: str, at_least: int = 1) -> str:
        """A new version name for ``model_id``, never handed out twice by any host: the next
        number after every stored or reserved one (and at least ``at_least``), claimed by a
        row without a manifest digest (invisible until :meth:`put_version` completes it)."""
        while True:
            with self.db.begin(write=True) as conn:
                top = conn.execute(select(func.max(model_versions.c.number)).where(
                    model_versions.c.model_id == model_id)).scalar()
            number = max((top or 0) + 1, at_least)
            try:
                with self.db.begin(write=True) as conn:
                    conn.execute(insert(model_versions).values(
                        model_id=model_id, version=f"v{number}", number=number,
                        manifest_sha256=None, files=0, bytes=0, bundle_id=None,
                        created_at=datetime.now(UTC)))
                return f"v{number}"
            except SQLIntegrityError:
                continue  # another host took it meanwhile

    def put_version(self, model_id: str, version: str, folder: str | os.PathLike,
                    bundle_id: str | None = None) -> bool:
        """Store a sealed version folder under ``version`` (reserved or new) in one
        transaction; True when written, False when the store already has it with the same
        manifest (idempotent). Conflict when it has another version under that name;
        IntegrityError when the folder is not whole or not sealed."""
        root = Path(folder)
        verified = verify_folder(root, digest_unsealed=False)
        if not verified.sealed:
            raise IntegrityError(f"{root}: has no {MANIFEST_FILE}; seal it before it is "
                                 "stored")
        digest = hashlib.sha256((root / MANIFEST_FILE).read_bytes()).hexdigest()
        names = [*folder_files(root), MANIFEST_FILE]
        key = and_(model_versions.c.model_id == model_id, model_versions.c.version == version)
        with self.db.begin(write=True) as conn:
            row = conn.execute(select(model_versions.c.manifest_sha256).where(key)
                               .with_for_update()).first()
            if row is not None and row[0] is not None:
                if row[0] == digest:
                    return False
                raise Conflict(f"the store has another {version} of model {model_id} "
                               f"(manifest {row[0][:12]}…, this folder's {digest[:12]}…)")
            folder_name = version_folder(model_id, version)
            conn.execute(delete(stored_files).where(stored_files.c.folder == folder_name))
            size = self._put_files(conn, folder_name, root, names)
            values = dict(manifest_sha256=digest, files=len(names), bytes=size,
                          bundle_id=bundle_id)
            if row is None:
                conn.execute(insert(model_versions).values(
                    model_id=model_id, version=version, number=_number(version),
                    created_at=datetime.now(UTC), **values))
            else:
                conn.execute(update(model_versions).where(key).values(**values))
        return True

    def versions(self, model_id: str) -> list[StoredVersion]:
        """The complete versions of ``model_id``, oldest first."""
        with self.db.begin() as conn:
            rows = conn.execute(select(model_versions).where(
                model_versions.c.model_id == model_id,
                model_versions.c.manifest_sha256.is_not(None))
                .order_by(model_versions.c.number)).mappings().all()
        return [StoredVersion(r["model_id"], r["version"], r["manifest_sha256"], r["files"],
                              r["bytes"], r["bundle_id"]) for r in rows]

    def version(self, model_id: str, version: str) -> StoredVersion | None:
        found = [v for v in self.versions(model_id) if v.version == version]
        return found[0] if found else None

    def model_ids(self) -> list[str]:
        with self.db.begin() as conn:
            return list(conn.execute(select(model_versions.c.model_id).distinct().where(
                model_versions.c.manifest_sha256.is_not(None))
                .order_by(model_versions.c.model_id)).scalars())

    def fetch_version(self, model_id: str, version: str, dest: str | os.PathLike
                      ) -> StoredVersion:
        """Write the files of a complete version into the empty folder ``dest`` and check
        them: the manifest's SHA-256 against the one stored beside the version, then every
        file against the manifest. NotFound for a version the store does not have complete;
        StoreIntegrityError when what was read is not what was stored."""
        stored = self.version(model_id, version)
        if stored is None:
            raise NotFound(f"model {model_id} has no version {version} in the store")
        self._get_files(version_folder(model_id, version), Path(dest))
        manifest = Path(dest) / MANIFEST_FILE
        got = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
        if got != stored.manifest_sha256:
            raise StoreIntegrityError(
                f"version {version} of model {model_id} in the store: its {MANIFEST_FILE} "
                f"does not match the digest recorded with it ({(got or 'none')[:12]}… read, "
                f"{stored.manifest_sha256[:12]}… stored); it is not used")
        try:
            verify_folder(dest, digest_unsealed=False)
        except IntegrityError as exc:
            raise StoreIntegrityError(f"version {version} of model {model_id} in the store "
                                      f"is not whole: {exc}") from None
        return stored

    # -- promotions --------------------------------------------------------------------------
    def promote(self, model_id: str, version: str) -> Promotion:
        """Point ``model_id`` at a complete stored ``version`` (NotFound otherwise); the serial
        grows by one."""
        with self.db.begin(write=True) as conn:
            ok = conn.execute(select(model_versions.c.version).where(
                model_versions.c.model_id == model_id, model_versions.c.version == version,
                model_versions.c.manifest_sha256.is_not(None))).first()
            if ok is None:
                raise NotFound(f"model {model_id} has no version {version} in the store")
            now = datetime.now(UTC)
            done = conn.execute(update(model_promotions).where(
                model_promotions.c.model_id == model_id).values(
                version=version, serial=model_promotions.c.serial + 1, promoted_at=now)
                .returning(model_promotions.c.serial)).first()
            if done is None:
                conn.execute(insert(model_promotions).values(
                    model_id=model_id, version=version, serial=1, promoted_at=now))
                return Promotion(version, 1)
            return Promotion(version, int(done[0]))

    def promotions(self) -> dict[str, Promotion]:
        """Every model's promoted version and serial: one small query (what replicas poll)."""
        with self.db.begin() as conn:
            rows = conn.execute(select(model_promotions.c.model_id, model_promotions.c.version,
                                       model_promotions.c.serial)).all()
        return {m: Promotion(v, int(s)) for m, v, s in rows}

    def promoted(self, model_id: str) -> str | None:
        p = self.promotions().get(model_id)
        return p.version if p else None

    # -- bundles -----------------------------------------------------------------------------
    def has_bundle(self, bundle_id: str) -> bool:
        with self.db.begin() as conn:
            return conn.execute(select(stored_bundles.c.bundle_id).where(
                stored_bundles.c.bundle_id == bundle_id)).first() is not None

    def put_bundle(self, bundle_id: str, folder: str | os.PathLike) -> bool:
        """Store a bundle folder (checked against its id first: ``shared.bundle``); False
        when the store has it already."""
        root = Path(folder)
        EdgeBundle.load(root, expected_id=bundle_id)  # ValueError-like if it is not whole
        names = list(folder_files(root))
        if (root / MANIFEST_FILE).is_file():
            names.append(MANIFEST_FILE)
        with self.db.begin(write=True) as conn:
            if conn.execute(select(stored_bundles.c.bundle_id).where(
                    stored_bundles.c.bundle_id == bundle_id).with_for_update()).first():
                return False
            name = bundle_folder(bundle_id)
            conn.execute(delete(stored_files).where(stored_files.c.folder == name))
            size = self._put_files(conn, name, root, names)
            conn.execute(insert(stored_bundles).values(
                bundle_id=bundle_id, files=len(names), bytes=size,
                created_at=datetime.now(UTC)))
        return True

    def fetch_bundle(self, bundle_id: str, dest: str | os.PathLike) -> None:
        """Write a stored bundle into the empty folder ``dest``, checked against its id
        (StoreIntegrityError otherwise); NotFound when the store has none."""
        if not self.has_bundle(bundle_id):
            raise NotFound(f"no bundle {bundle_id[:12]}… in the store")
        self._get_files(bundle_folder(bundle_id), Path(dest))
        try:
            EdgeBundle.load(Path(dest), expected_id=bundle_id)
        except Exception as exc:  # whatever a damaged bundle raises: refused
            raise StoreIntegrityError(f"bundle {bundle_id[:12]}… in the store is not whole: "
                                      f"{exc}") from None

    # -- bases -------------------------------------------------------------------------------
    def base_digest(self, name: str) -> str | None:
        """The manifest SHA-256 of a stored base (None: no such base)."""
        with self.db.begin() as conn:
            return conn.execute(select(stored_bases.c.manifest_sha256).where(
                stored_bases.c.name == name)).scalar()

    def put_base(self, name: str, folder: str | os.PathLike) -> bool:
        """Store a sealed base folder (a BERT a retraining job may start from) under
        ``name``; False when the store has it with the same manifest, Conflict when it has
        another base of that name."""
        root = Path(folder)
        if not verify_folder(root, digest_unsealed=False).sealed:
            raise IntegrityError(f"{root}: has no {MANIFEST_FILE}; seal it before it is "
                                 "stored")
        digest = hashlib.sha256((root / MANIFEST_FILE).read_bytes()).hexdigest()
        with self.db.begin(write=True) as conn:
            have = conn.execute(select(stored_bases.c.manifest_sha256).where(
                stored_bases.c.name == name).with_for_update()).scalar()
            if have is not None:
                if have == digest:
                    return False
                raise Conflict(f"the store has another base named {name!r}")
            folder_name = base_folder(name)
            conn.execute(delete(stored_files).where(stored_files.c.folder == folder_name))
            names = [*folder_files(root), MANIFEST_FILE]
            size = self._put_files(conn, folder_name, root, names)
            conn.execute(insert(stored_bases).values(
                name=name, manifest_sha256=digest, files=len(names), bytes=size,
                created_at=datetime.now(UTC)))
        return True

    def fetch_base(self, name: str, dest: str | os.PathLike) -> None:
        """Write a stored base into the empty folder ``dest``, checked as a version is
        (StoreIntegrityError); NotFound when the store has none."""
        digest = self.base_digest(name)
        if digest is None:
            raise NotFound(f"no base named {name!r} in the store")
        self._get_files(base_folder(name), Path(dest))
        manifest = Path(dest) / MANIFEST_FILE
        got = hashlib.sha256(manifest.read_bytes()).hexdigest() if manifest.is_file() else None
        if got != digest:
            raise StoreIntegrityError(f"base {name} in the store: its {MANIFEST_FILE} does not "
                                      "match the digest recorded with it; it is not used")
        try:
            verify_folder(dest, digest_unsealed=False)
        except IntegrityError as exc:
            raise StoreIntegrityError(f"base {name} in the store is not whole: {exc}") from None

    # -- files -------------------------------------------------------------------------------
    @staticmethod
    def _put_files(conn, folder: str, root: Path, names: list[str]) -> int:
        size = 0
        for name in names:
            for i, block in enumerate(_chunks(root / name)):
                conn.execute(insert(stored_files).values(folder=folder, path=name, chunk=i,
                                                         data=block))
                size += len(block)
        return size

    def _get_files(self, folder: str, dest: Path) -> None:
        """Stream the rows of ``folder`` into files under ``dest`` (one chunk in memory)."""
        dest.mkdir(parents=True, exist_ok=True)
        root = dest.resolve()
        with self.db.begin() as conn:
            result = conn.execution_options(stream_results=True, yield_per=4).execute(
                select(stored_files.c.path, stored_files.c.chunk, stored_files.c.data)
                .where(stored_files.c.folder == folder)
                .order_by(stored_files.c.path, stored_files.c.chunk))
            fh = None
            current = None
            try:
                for path, _chunk, data in result:
                    if path != current:
                        if fh is not None:
                            fh.close()
                        target = (root / path).resolve()
                        if root not in target.parents:
                            raise StoreIntegrityError(f"{folder}: a stored file name leaves "
                                                      f"its folder ({path!r})")
                        target.parent.mkdir(parents=True, exist_ok=True)
                        fh = open(target, "wb")
                        current = path
                    assert fh is not None
                    fh.write(bytes(data))
            finally:
                if fh is not None:
                    fh.close()
