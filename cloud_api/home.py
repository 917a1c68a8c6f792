"""``$PRIVBERT_HOME`` on disk: model versions, promoted pointers, bundles, bases, job folders.

    $PRIVBERT_HOME/
      models/<model_id>/versions/<version>/   a version folder of models/versions/model_version.py
      models/<model_id>/promoted              the promoted version's name, replaced atomically
      bundles/<bundle_id>/                    edge bundles (EdgeBundle.save)
      bases/<name>/                           pretrained bases (cloud-api pretrain output)
      posteriors/<mechanism>-<digest>.npz     channel posteriors built from public text
                                              (models.training.posterior; a cache, safe to delete)
      jobs/<job_id>/                          a job's work folder and log

Everything here is plain files so that several processes (server instances, uvicorn
processes, job workers, the CLI) sharing the folder see each other's changes: a version
folder appears by one rename, a promotion by one ``os.replace`` of the pointer file.
Every promotion holds the model's promotion lock (``models/<model_id>/.promote.lock``,
``flock``, plus a lock per process for threads), so "read the pointer, check it, write it"
(the swap that promotes a job's version, ``cloud_api/jobs/publisher.py``) is atomic across
threads, processes and hosts sharing the folder; nothing slow runs under it. Nothing here
imports torch.

A version is whole or it is not used: every file of it has a SHA-256 in its
``manifest.json`` (``models.versions.manifest``), written when it is registered (:meth:`register`),
and checked when it is loaded to serve (``cloud_api.serving.loading``), promoted
(:meth:`promote`) and read by a retraining job; every array in it is finite. A mismatch is
refused in one line and changes nothing.

A manifest can be deleted or rewritten by whoever can write the folder (issue 42: a version
"laundered"). So a home with :class:`SealRecords` (the server's database: ``version_seals``,
``cloud_api.store.seals``) records the SHA-256 of each version's manifest when it seals it,
outside the folder, and :meth:`verify` refuses a version whose manifest is missing or is not
the one recorded. A version the records do not know yet (sealed, or even made, before they
existed) is checked as before (against its manifest, or, without one, for finite arrays and
then sealed) and recorded on its first verified load (one log line); from then on its
manifest can no more be deleted or rewritten. A version changed on purpose is resealed by an
admin (:meth:`reseal`, ``cloud-api models reseal``: it says what it seals).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cloud_api.errors import InvalidRequest, NotFound
from models.versions.manifest import (
    MANIFEST_FILE,
    IntegrityError,
    Verified,
    check_finite_arrays,
    file_sha256,
    folder_files,
    manifest_sha256,
    seal,
    verify_folder,
)

# a model id, task, base or job name: a safe folder name (also the HTTP routes' pattern)
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
VERSION_PATTERN = r"^v([1-9][0-9]{0,8})$"
_ID = re.compile(ID_PATTERN)
_VERSION = re.compile(VERSION_PATTERN)
CONFIG_FILE = "config.json"  # models/versions/model_version.py: its presence means the folder is complete
PROMOTE_LOCK = ".promote.lock"
_THREAD_LOCKS: dict[str, threading.Lock] = {}  # per lock file: flock may be per process
_THREAD_LOCKS_GUARD = threading.Lock()        # (NFS emulates it with POSIX locks)
log = logging.getLogger(__name__)


def is_id(value: object) -> bool:
    """True for a safe folder name (letters, digits, ``_.-``; at most 64)."""
    return isinstance(value, str) and bool(_ID.match(value)) and value not in (".", "..")


def check_id(kind: str, value: str) -> str:
    """``value`` if it :func:`is_id`, else InvalidRequest naming ``kind``."""
    if not is_id(value):
        raise InvalidRequest(f"{kind} must be 1-64 letters, digits, '_', '.' or '-' and start "
                             f"with a letter or digit")
    return value


def version_number(version: str) -> int | None:
    m = _VERSION.match(version or "")
    return int(m.group(1)) if m else None


def write_atomically(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace ``path`` by ``text`` in one rename: readers see the old or the new file, never
    a part. ``durable``: fsync before the rename (pointers; not per-step progress files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class SyncReport:
    """What one :meth:`ModelHome.sync` did: ``changed`` {model: version now pointed at here},
    ``failed`` {model: why its promoted version is not used here}."""

    changed: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class SealRecords(Protocol):
    """The SHA-256 of each version's sealed manifest, kept outside the home's folders (the
    server's database: ``cloud_api.store.seals.DatabaseSeals``)."""

    def get(self, model_id: str, version: str) -> str | None: ...

    def put(self, model_id: str, version: str, digest: str) -> None: ...


class ModelHome:
    """The folder layout above; every method is safe to call from several processes.
    ``seals``: where the manifests' digests are recorded (None: nowhere, see above)."""

    def __init__(self, root: str | os.PathLike, seals: SealRecords | None = None):
        self.root = Path(root)
        self.seals = seals

    # -- folders ----------------------------------------------------------------------------
    @property
    def models_dir(self) -> Path:
        return self.root / "models"

    @property
    def bundles_dir(self) -> Path:
        return self.root / "bundles"

    @property
    def bases_dir(self) -> Path:
        return self.root / "bases"

    @property
    def posteriors_dir(self) -> Path:
        return self.root / "posteriors"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def ensure(self) -> ModelHome:
        for d in (self.models_dir, self.bundles_dir, self.bases_dir, self.jobs_dir):
            d.mkdir(parents=True, exist_ok=True)
        return self

    def model_dir(self, model_id: str) -> Path:
        return self.models_dir / check_id("model id", model_id)

    def version_dir(self, model_id: str, version: str) -> Path:
        if version_number(version) is None:
            raise InvalidRequest("version must look like v1, v2, ...")
        return self.model_dir(model_id) / "versions" / version

    def bundle_dir(self, bundle_id: str) -> Path:
        if not re.match(r"^[0-9a-f]{64}$", bundle_id or ""):
            raise InvalidRequest("bundle id must be 64 lower-case hex digits")
        return self.bundles_dir / bundle_id

    def base_dir(self, name: str) -> Path:
        return self.bases_dir / check_id("base name", name)

    def job_dir(self, job_id: str | int) -> Path:
        return self.jobs_dir / check_id("job id", str(job_id))

    # -- listing ----------------------------------------------------------------------------
    def model_ids(self) -> list[str]:
        if not self.models_dir.is_dir():
            return []
        return sorted(p.name for p in self.models_dir.iterdir()
                      if p.is_dir() and _ID.match(p.name))

    def versions(self, model_id: str) -> list[str]:
        """Complete versions (with config.json), oldest first."""
        vdir = self.model_dir(model_id) / "versions"
        if not vdir.is_dir():
            return []
        found = [(n, p.name) for p in vdir.iterdir()
                 if (n := version_number(p.name)) is not None and (p / CONFIG_FILE).is_file()]
        return [name for _, name in sorted(found)]

    def promoted(self, model_id: str) -> str | None:
        """The promoted version of ``model_id`` (None when nothing is promoted)."""
        try:
            text = (self.model_dir(model_id) / "promoted").read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return text if version_number(text) is not None else None

    def promoted_all(self) -> dict[str, str]:
        return {m: v for m in self.model_ids() if (v := self.promoted(m)) is not None}

    # -- changes ----------------------------------------------------------------------------
    @contextmanager
    def promotion_lock(self, model_id: str) -> Iterator[None]:
        """Exclusive hold on ``model_id``'s promoted pointer, across threads, processes and
        hosts sharing this folder; released when the block ends or the process dies."""
        mdir = self.model_dir(model_id)
        mdir.mkdir(parents=True, exist_ok=True)
        path = mdir / PROMOTE_LOCK
        key = os.path.realpath(path)
        with _THREAD_LOCKS_GUARD:
            local = _THREAD_LOCKS.setdefault(key, threading.Lock())
        with local:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the flock

    def promote(self, model_id: str, version: str, *, verify: bool = True) -> Path:
        """Point ``model_id`` at ``version`` (one atomic replace, under the promotion lock);
        returns the version folder. The version is verified first (:meth:`verify`, no lock
        held; InvalidRequest naming the file that does not match), unless the caller has
        just done so (``verify=False``)."""
        self._complete_version(model_id, version)  # no folder (the lock's) for a typo
        if verify:
            self.verify(model_id, version)
        with self.promotion_lock(model_id):
            return self.write_promoted(model_id, version)

    def write_promoted(self, model_id: str, version: str) -> Path:
        """Point ``model_id`` at ``version`` now; the caller holds :meth:`promotion_lock`
        (and has decided under it). Returns the version folder."""
        path = self._complete_version(model_id, version)
        write_atomically(self.model_dir(model_id) / "promoted", version + "\n")
        return path

    def _complete_version(self, model_id: str, version: str) -> Path:
        path = self.version_dir(model_id, version)
        if not (path / CONFIG_FILE).is_file():
            raise NotFound(f"model {model_id} has no version {version}")
        return path

    def verify(self, model_id: str, version: str, *, seal_missing: bool = True) -> Verified:
        """Check every file of a version against its manifest (``models.versions.manifest``), and the
        manifest against the digest recorded when it was sealed (:class:`SealRecords`);
        InvalidRequest (one line) if one does not match. Without records, a version from
        before manifests is checked for finite arrays and, with ``seal_missing``, sealed now
        (where the home cannot be written, it is served all the same, with a warning)."""
        path = self._complete_version(model_id, version)
        recorded, known = self._recorded(model_id, version)
        try:
            verified = verify_folder(path, digest_unsealed=seal_missing,
                                     sealed_digest=recorded)
        except IntegrityError as exc:
            raise InvalidRequest(f"version {version} of model {model_id} is not whole: "
                                 f"{exc}") from None
        if not verified.sealed and seal_missing:
            seal_verified(verified, f"version {version} of model {model_id}")
        if self.seals is not None and known and recorded is None:  # sealed before records
            digest = manifest_sha256(path)
            if digest is not None:
                self.seals.put(model_id, version, digest)
                log.info("version %s of model %s: its manifest's SHA-256 %s… recorded (a "
                         "manifest changed from now on is refused)", version, model_id,
                         digest[:12])
        return verified

    def _recorded(self, model_id: str, version: str) -> tuple[str | None, bool]:
        """(the recorded digest or None, whether the records could be read): a database out
        of reach leaves the manifest checked on its own (logged), never the version unserved."""
        if self.seals is None:
            return None, False
        try:
            return self.seals.get(model_id, version), True
        except Exception as exc:  # noqa: BLE001 (Unavailable, a driver's error: logged)
            log.warning("version %s of model %s: its seal record cannot be read (%s); its "
                        "manifest is checked on its own", version, model_id, exc)
            return None, False

    def reseal(self, model_id: str, version: str) -> tuple[Verified, str]:
        """Seal a version on purpose as it is now (an admin's decision, after changing it):
        every array checked finite, a new manifest of its files, its digest recorded.
        Returns the sealed digests and the manifest's SHA-256; InvalidRequest (one line) for
        non-finite arrays."""
        path = self._complete_version(model_id, version)
        present = folder_files(path)
        try:
            check_finite_arrays(path, present)
        except IntegrityError as exc:
            raise InvalidRequest(f"version {version} of model {model_id} cannot be resealed: "
                                 f"{exc}") from None
        verified = Verified(path, {n: file_sha256(path / n) for n in present}, sealed=False)
        seal(verified)
        digest = manifest_sha256(path)
        assert digest is not None
        if self.seals is not None:
            self.seals.put(model_id, version, digest)
        log.warning("version %s of model %s resealed on purpose: %d files, manifest %s…",
                    version, model_id, len(present), digest[:12])
        return verified, digest

    def record_seal(self, model_id: str, version: str) -> None:
        """Record the manifest's digest of a version just sealed (register, a job's output)."""
        if self.seals is None:
            return
        digest = manifest_sha256(self.version_dir(model_id, version))
        if digest is not None:
            self.seals.put(model_id, version, digest)

    def reserve_version(self, model_id: str) -> tuple[str, Path]:
        """A new empty version folder ``v<n+1>`` (mkdir is atomic, so two processes never get
        the same one). Fill it with one rename onto it, as :meth:`register` does (never
        delete it first: another process could take the name meanwhile); an empty folder
        left by a crash is never listed."""
        vdir = self.model_dir(model_id) / "versions"
        vdir.mkdir(parents=True, exist_ok=True)
        while True:
            taken = [n for p in vdir.iterdir() if (n := version_number(p.name)) is not None]
            version = f"v{max(taken, default=0) + 1}"
            try:
                (vdir / version).mkdir()
            except FileExistsError:
                continue
            return version, vdir / version

    def register(self, model_id: str, src: str | os.PathLike, *, move: bool = False,
                 prepare: Callable[[Path], object] | None = None, sealed: bool = False) -> str:
        """Add a complete model folder as the next version (copied, or moved when on the same
        file system and ``move``). ``prepare(folder)`` runs on the copy (or, with ``move``,
        on ``src``) before it becomes the version: files a server must find at once (the
        int8 classifier). The folder is verified and sealed (:func:`seal_folder`) before it
        becomes the version, unless the caller has just sealed it (``sealed``, with
        ``move``: the job publisher, which seals before it takes the promotion lock).
        Returns the version name."""
        src = Path(src)
        if not (src / CONFIG_FILE).is_file():
            raise InvalidRequest(f"{src} is not a model version folder (no {CONFIG_FILE})")
        if move and prepare is not None:
            prepare(src)
        if move and not sealed:
            seal_folder(src)
        version, dest = self.reserve_version(model_id)
        try:
            if move:
                os.replace(src, dest)  # rename(2) onto an empty folder
            else:
                tmp = Path(tempfile.mkdtemp(prefix=f".{version}.tmp-", dir=dest.parent))
                shutil.copytree(src, tmp, dirs_exist_ok=True)
                os.chmod(tmp, 0o755)
                try:
                    if prepare is not None:
                        prepare(tmp)
                    seal_folder(tmp)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        self.record_seal(model_id, version)
        return version

    def materialize(self, model_id: str, version: str) -> Path:
        """The folder of ``version`` on this host (here: where it is; a home whose versions
        live in a shared store fetches it first, ``cloud_api.store.stored_home``)."""
        return self.version_dir(model_id, version)

    def publish_base(self, name: str) -> None:
        """A base that just entered ``bases/`` (here: nothing more to do; a shared store
        stores it, ``cloud_api.store.stored_home``)."""

    def sync(self) -> SyncReport:
        """Point this host at what the deployment promotes (here: the pointers are the
        deployment's, nothing to do; ``cloud_api.store.stored_home`` fetches)."""
        return SyncReport()

    def read_config(self, model_id: str, version: str) -> dict:
        path = self.version_dir(model_id, version) / CONFIG_FILE
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise NotFound(f"model {model_id} has no version {version}") from None


def seal_folder(path: str | os.PathLike) -> Verified:
    """Verify a folder about to enter the home (``models.versions.manifest``: against its manifest,
    a copy's integrity in transit, or for finite weights) and write its manifest when it
    has none; InvalidRequest (one line) when it is not whole."""
    try:
        verified = verify_folder(path)
    except IntegrityError as exc:
        hint = ("" if not (Path(path) / MANIFEST_FILE).exists() else
                f"; if the folder was changed on purpose, remove its {MANIFEST_FILE} and "
                "register it again (it is then checked for finite weights and sealed anew)")
        raise InvalidRequest(f"{exc}{hint}") from None
    if not verified.sealed:
        seal(verified)
    return verified


def seal_verified(verified: Verified, what: str) -> bool:
    """Write the manifest of a verified folder from before manifests; False (and a warning
    in the log) when the folder cannot be written: it is used unsealed."""
    try:
        seal(verified)
    except OSError as exc:
        log.warning("%s has no manifest.json and none could be written (%s): it is used "
                    "unsealed; run `cloud-api models verify` where the home is writable",
                    what, exc.strerror or exc)
        return False
    log.info("%s had no manifest.json: verified (finite weights) and sealed", what)
    return True

