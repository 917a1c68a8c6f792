"""Compressed answers, made by the HTTP layer: the edge bundle's tarball in gzip.

The tarball (``BundleStore.tarball``) is made once per bundle; its gzip copy is made once too,
at the first request that accepts gzip (about 2.5 s of one CPU for the 47 MB MiniLM bundle,
in a worker thread), and kept for the last :data:`KEEP` bundles asked for. A bundle that
gzip shrinks by less than :data:`MIN_SAVING` is sent as it is. gzip only: every browser and
HTTP client accepts it, and brotli gains nothing on a float32 table (42.8 MB against 43.0).
"""

from __future__ import annotations

import gzip
import threading
from collections import OrderedDict

KEEP = 2
MIN_SAVING = 0.05
LEVEL = 6


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an Accept-Encoding value admits gzip (q > 0)."""
    for part in (accept_encoding or "").split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() in ("gzip", "x-gzip", "*"):
            params = params.strip()
            if not params.startswith("q="):
                return True
            try:
                return float(params[2:]) > 0
            except ValueError:
                return False
    return False


class CompressedTarballs:
    """gzip copies of bundle tarballs by bundle id (thread-safe; one compression per id)."""

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._copies: OrderedDict[str, bytes | None] = OrderedDict()
        self._lock = threading.Lock()
        self._making: dict[str, threading.Lock] = {}

    def gzip(self, bundle_id: str, tarball: bytes) -> bytes | None:
        """The gzip copy of ``tarball`` (the bundle ``bundle_id``), or None when it is not
        worth sending. Blocks while another thread makes the same copy."""
        with self._lock:
            if bundle_id in self._copies:
                self._copies.move_to_end(bundle_id)
                return self._copies[bundle_id]
            making = self._making.setdefault(bundle_id, threading.Lock())
        with making:
            with self._lock:
                if bundle_id in self._copies:
                    return self._copies[bundle_id]
            packed = gzip.compress(tarball, compresslevel=LEVEL, mtime=0)
            copy = packed if len(packed) <= (1 - MIN_SAVING) * len(tarball) else None
            with self._lock:
                self._copies[bundle_id] = copy
                self._copies.move_to_end(bundle_id)
                while len(self._copies) > self.keep:
                    self._copies.popitem(last=False)
                self._making.pop(bundle_id, None)
            return copy
