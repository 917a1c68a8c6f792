"""Fetch a model's edge bundle from the server once, cache it, verify its hash.

Cache: ``$PRIVBERT_CACHE/<bundle_id>`` if set, else
``$XDG_CACHE_HOME/privbert/bundles/<bundle_id>`` (default ``~/.cache/...``).
Every load checks each file against ``bundle.json`` and the id against the one
the server named (``EdgeBundle.load(dir, expected_id)``); a cached copy that
fails is fetched again, a download that fails is never written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from shared.bundle import BundleError, EdgeBundle, save_atomically
from shared.conventions import CACHE_ENV, CACHE_SUBDIR

_BUNDLE_ID = re.compile(r"^[0-9a-f]{64}$")


def cache_root() -> Path:
    """Where bundles are cached."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser().joinpath(*CACHE_SUBDIR)


def cached_path(bundle_id: str, root: Path | None = None) -> Path:
    """The cache folder of ``bundle_id`` (which must be 64 hex digits: no path tricks)."""
    if not _BUNDLE_ID.match(bundle_id or ""):
        raise BundleError(f"not a bundle id (64 hex digits): {bundle_id!r}")
    return (root or cache_root()) / bundle_id


def fetch_bundle(client, bundle_id: str, root: Path | None = None, refresh: bool = False
                 ) -> tuple[EdgeBundle, Path, bool]:
    """(bundle, its cache folder, whether it was downloaded now)."""
    path = cached_path(bundle_id, root)
    if path.is_dir() and not refresh:
        try:
            return EdgeBundle.load(path, expected_id=bundle_id), path, False
        except BundleError:
            pass  # corrupted or partial cache: fetch again
    data = client.bundle_bytes(bundle_id)
    try:
        bundle = EdgeBundle.from_tar_bytes(data, expected_id=bundle_id)
    except BundleError as exc:
        raise BundleError(f"the bundle the server sent for {bundle_id[:12]}… failed "
                          f"verification: {exc}") from None
    save_atomically(bundle, path)
    return bundle, path, True


def bundle_for_model(client, model_id: str | None = None, root: Path | None = None,
                     refresh: bool = False, model: dict | None = None
                     ) -> tuple[EdgeBundle, dict, Path, bool]:
    """The served model's description (``GET /v1/models``, unless given) and its bundle
    (fetched once, then cached)."""
    model = model if model is not None else client.model(model_id)
    bundle_id = model.get("bundle_id")
    if not isinstance(bundle_id, str):
        raise BundleError(f"model {model.get('id')!r} names no bundle_id")
    bundle, path, fetched = fetch_bundle(client, bundle_id, root, refresh)
    return bundle, model, path, fetched
