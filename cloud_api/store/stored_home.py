"""A model home whose versions, promotions and bundles live in the database
(``PRIVBERT_MODEL_STORE=database``), with the folder on disk as this host's cache.

    home = open_home(settings)             # ModelHome, or StoredHome when the store is shared
    home.sync()                            # fetch what the store promotes, point at it here

Every replica (``cloud-api serve``), job worker and CLI of one deployment shares the store
(:class:`~cloud_api.store.model_store.ModelStore`) and keeps its own ``$PRIVBERT_HOME`` (an
``emptyDir`` on Kubernetes) as a cache: a version is fetched once into a temporary folder,
checked whole (manifest digest, every file: ``models.versions.manifest``), renamed into
``models/<id>/versions/<v>`` and only then named by the local ``promoted`` pointer, so the
serving code (``cloud_api.serving``), which reads the local folders as on one machine,
never sees a half-written version. A version that fails its check is not used: the local
pointer keeps naming the previous one, which keeps serving, and :meth:`StoredHome.sync`
reports why.

What changes against :class:`~cloud_api.home.ModelHome`: version numbers come from the
store (unique across hosts); :meth:`register` also stores the version and its bundle, and
:meth:`publish_base` a base a pretraining job made; :meth:`base_dir` fetches a stored base;
:meth:`write_promoted` writes the store's promotion row, then the local pointer;
:meth:`promoted` and :meth:`versions` answer from the store (what is true for the whole
deployment), :meth:`promoted_all` from the local pointers (what this host has fetched and
checked: what it serves); :meth:`promotion_lock` adds a PostgreSQL advisory lock (a transaction's), so
promotions exclude each other across hosts as ``flock`` does on one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import text

from cloud_api.errors import NotFound, ServiceError, Unavailable
from cloud_api.home import (
    CONFIG_FILE,
    ModelHome,
    SyncReport,
    seal_folder,
    version_number,
    write_atomically,
)
from cloud_api.settings import Settings
from cloud_api.store.db import Database
from cloud_api.store.model_store import ModelStore
from models.versions.manifest import IntegrityError, Verified

log = logging.getLogger(__name__)
_LOCK_BASE = 0x70726F6D  # advisory lock ids of promotions: this plus a hash of the model id


def open_home(settings: Settings, db: Database | None = None) -> ModelHome:
    """The model home the settings name: ``$PRIVBERT_HOME`` on disk, or with
    ``PRIVBERT_MODEL_STORE=database`` the store of ``db`` (default: the settings' database)
    with ``$PRIVBERT_HOME`` as this host's cache."""
    if settings.model_store != "database":
        return ModelHome(settings.home)
    return StoredHome(settings.home, ModelStore(db or Database.from_settings(settings)))


class StoredHome(ModelHome):
    """See the module docstring."""

    def __init__(self, root: str | os.PathLike, store: ModelStore):
        super().__init__(root)
        self.store = store

    # -- the deployment's truth ----------------------------------------------------------
    def versions(self, model_id: str) -> list[str]:
        return [v.version for v in self.store.versions(model_id)]

    def model_ids(self) -> list[str]:
        return sorted(set(self.store.model_ids()) | set(super().model_ids()))

    def promoted(self, model_id: str) -> str | None:
        """The store's promoted version (this host's pointer while the database is away)."""
        try:
            return self.store.promoted(model_id)
        except Unavailable:
            return self.local_promoted(model_id)

    def promoted_all(self) -> dict[str, str]:
        """The local pointers: what this host has fetched, checked and may serve."""
        return {m: v for m in super().model_ids() if (v := self.local_promoted(m))}

    def local_promoted(self, model_id: str) -> str | None:
        return ModelHome.promoted(self, model_id)

    # -- writing ---------------------------------------------------------------------------
    def reserve_version(self, model_id: str) -> tuple[str, Path]:
        vdir = self.model_dir(model_id) / "versions"
        vdir.mkdir(parents=True, exist_ok=True)
        local = [n for p in vdir.iterdir() if (n := version_number(p.name)) is not None]
        while True:
            version = self.store.reserve(model_id, at_least=max(local, default=0) + 1)
            try:
                (vdir / version).mkdir()
            except FileExistsError:  # a leftover of this cache: take the next number
                local.append(version_number(version) or 0)
                continue
            return version, vdir / version

    def register(self, model_id: str, src: str | os.PathLike, *, move: bool = False,
                 prepare: Callable[[Path], object] | None = None, sealed: bool = False) -> str:
        version = super().register(model_id, src, move=move, prepare=prepare, sealed=sealed)
        self.publish(model_id, version)
        return version

    def publish(self, model_id: str, version: str) -> bool:
        """Store a local, sealed version (and its bundle when the home has it); idempotent."""
        path = self.version_dir(model_id, version)
        bundle_id = self.read_config(model_id, version).get("bundle_id")
        if bundle_id and (self.bundles_dir / bundle_id).is_dir():
            self.store.put_bundle(bundle_id, self.bundles_dir / bundle_id)
        return self.store.put_version(model_id, version, path, bundle_id=bundle_id)

    def promote(self, model_id: str, version: str, *, verify: bool = True) -> Path:
        self.materialize(model_id, version)
        return super().promote(model_id, version, verify=verify)

    def write_promoted(self, model_id: str, version: str) -> Path:
        """The store's promotion row (the deployment's), then this host's pointer."""
        path = self.materialize(model_id, version)
        self.store.promote(model_id, version)
        write_atomically(self.model_dir(model_id) / "promoted", version + "\n")
        return path

    def verify(self, model_id: str, version: str, *, seal_missing: bool = True) -> Verified:
        self.materialize(model_id, version)
        return super().verify(model_id, version, seal_missing=seal_missing)

    def read_config(self, model_id: str, version: str) -> dict:
        if not (self.version_dir(model_id, version) / CONFIG_FILE).is_file():
            self.materialize(model_id, version)
        return super().read_config(model_id, version)

    @contextmanager
    def promotion_lock(self, model_id: str) -> Iterator[None]:
        with super().promotion_lock(model_id):
            if self.store.db.dialect != "postgresql":  # one machine: flock is enough
                yield
                return
            key = _LOCK_BASE + int(hashlib.sha256(model_id.encode()).hexdigest()[:7], 16)
            # a transaction's lock, held open for the swap: released with the transaction
            # (also through a transaction-pooling PgBouncer, where a session's would leak)
            with self.store.db.outage_as_unavailable(), self.store.db.engine.begin() as conn:
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
                yield

    def publish_base(self, name: str) -> None:
        """Store ``bases/<name>`` (sealed first if it has no manifest); idempotent."""
        path = ModelHome.base_dir(self, name)
        seal_folder(path)
        self.store.put_base(name, path)

    def base_dir(self, name: str) -> Path:
        """``bases/<name>`` here, fetched from the store and checked first when this host
        lacks it and the store has it (a name neither has is returned as it is: free)."""
        path = ModelHome.base_dir(self, name)
        if path.is_dir() or self.store.base_digest(name) is None:
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.fetch-", dir=path.parent))
        try:
            self.store.fetch_base(name, tmp)
            os.chmod(tmp, 0o755)
            try:
                os.replace(tmp, path)
            except OSError:
                if not path.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("base %s fetched from the store and checked whole", name)
        return path

    # -- reading into the cache ------------------------------------------------------------
    def materialize(self, model_id: str, version: str) -> Path:
        """The local folder of ``version``, fetched from the store and checked first when
        this host does not have it complete (NotFound when the store has no such version;
        StoreIntegrityError when what it holds is not whole: nothing is then written)."""
        path = self.version_dir(model_id, version)
        if (path / CONFIG_FILE).is_file():
            return path
        vdir = path.parent
        vdir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{version}.fetch-", dir=vdir))
        try:
            stored = self.store.fetch_version(model_id, version, tmp)
            if stored.bundle_id:
                self.materialize_bundle(stored.bundle_id)
            os.chmod(tmp, 0o755)
            if path.exists():  # an empty folder reserved here, or a stale leftover
                shutil.rmtree(path)
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("model %s %s fetched from the store and checked whole", model_id, version)
        return path

    def materialize_bundle(self, bundle_id: str) -> None:
        """Fetch a stored bundle into ``bundles/`` when the home lacks it (the packaged
        default bundle is never stored: nothing to do when the store has none)."""
        dest = self.bundle_dir(bundle_id)
        if dest.is_dir() or not self.store.has_bundle(bundle_id):
            return
        self.bundles_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{bundle_id[:12]}.fetch-", dir=self.bundles_dir))
        try:
            self.store.fetch_bundle(bundle_id, tmp)
            os.chmod(tmp, 0o755)
            try:
                os.replace(tmp, dest)
            except OSError:
                if not dest.is_dir():  # another thread put it there first: fine
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def sync(self) -> SyncReport:
        """Make this host's pointers name what the store promotes: each promoted version not
        here is fetched and checked first. A version that cannot be fetched or is not whole
        leaves the pointer (and the version served) as it was, with the reason in the
        report. Unavailable (from the database) when the store cannot be read."""
        report = SyncReport()
        for model_id, promo in sorted(self.store.promotions().items()):
            if self.local_promoted(model_id) == promo.version:
                continue
            try:
                self.materialize(model_id, promo.version)
            except (IntegrityError, NotFound, OSError) as exc:
                report.failed[model_id] = f"{promo.version}: {exc}"
                log.error("model %s %s from the store is not used: %s", model_id,
                          promo.version, exc)
                continue
            except ServiceError as exc:
                report.failed[model_id] = f"{promo.version}: {exc.detail}"
                continue
            write_atomically(self.model_dir(model_id) / "promoted", promo.version + "\n")
            report.changed[model_id] = promo.version
        return report


def import_home(home: ModelHome, store: ModelStore, say: Callable[[str], object] = print
                ) -> int:
    """Copy every base and every complete version of a home on disk (and the bundles they
    name) into the store under the same names, and each model's promotion where the store
    has none yet.
    Safe to run again: what is stored already is left as it is. Returns the number of
    versions that could not be imported (each said in one line)."""
    problems = 0
    if home.bases_dir.is_dir():
        for base in sorted(p for p in home.bases_dir.iterdir()
                           if p.is_dir() and not p.name.startswith(".")):
            try:
                seal_folder(base)
                wrote = store.put_base(base.name, base)
            except (ServiceError, IntegrityError, OSError, ValueError) as exc:
                problems += 1
                say(f"base {base.name}: NOT imported: {getattr(exc, 'detail', None) or exc}")
                continue
            say(f"base {base.name}: {'imported' if wrote else 'already in the store'}")
    for model_id in ModelHome.model_ids(home):
        for version in ModelHome.versions(home, model_id):
            try:
                ModelHome.verify(home, model_id, version)  # seals a version from before manifests
                path = home.version_dir(model_id, version)
                config = ModelHome.read_config(home, model_id, version)
                bundle_id = config.get("bundle_id")
                if bundle_id and (home.bundles_dir / bundle_id).is_dir():
                    store.put_bundle(bundle_id, home.bundles_dir / bundle_id)
                wrote = store.put_version(model_id, version, path, bundle_id=bundle_id)
            except (ServiceError, IntegrityError, OSError, ValueError) as exc:
                problems += 1
                say(f"{model_id} {version}: NOT imported: "
                    f"{getattr(exc, 'detail', None) or exc}")
                continue
            say(f"{model_id} {version}: {'imported' if wrote else 'already in the store'}")
        local = ModelHome.promoted(home, model_id)
        stored = store.promoted(model_id)
        if local and stored is None and store.version(model_id, local) is not None:
            store.promote(model_id, local)
            say(f"{model_id}: promoted {local} in the store")
        elif local:
            say(f"{model_id}: the store promotes {stored} (left as it is; this home: {local})")
    return problems
