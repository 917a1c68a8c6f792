"""Bundle pinning: a device remembers the bundle it first accepted for a served model.

The bundle decides what privatization means (its table is the space the noise is added in),
and it comes from a server the device need not trust. So the first bundle a device accepts
for ``(server, model)`` is pinned, and a server that later names another one is refused in
one line naming both ids, until the user accepts the new id explicitly
(``--accept-bundle ID``). A pin is keyed by the server (scheme, host, port, path) and the
model; a server that stops serving a pinned model and serves one under a new name with a
new bundle (a rename, to be pinned afresh) is refused the same way (issue 42). An app can
also ship the ids it trusts (``--trusted-bundles`` or ``$PRIVBERT_TRUSTED_BUNDLES``,
comma-separated), which replace a pin without asking; ``--refuse-unverified``
(``edge_agent.service.known_bundles``) refuses every bundle neither known nor trusted.

The pins live in ``pins.json`` next to the bundle cache (``$PRIVBERT_CACHE``), written
atomically, mode 0600, under the ledger's rules: one that others can write is refused, one
they can read is warned about, a symlink is resolved once (its target is read and
replaced). A file the device cannot read as pins is an error, never a silent fresh start
(which would accept whatever the server says).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from edge_agent.errors import CliError, warn
from shared.conventions import TRUSTED_ENV
from shared.messages import PIN_CHANGED, PIN_RENAMED

_BUNDLE_ID = re.compile(r"^[0-9a-f]{64}$")


class BundleChanged(CliError):
    """The server names a bundle other than the one this device pinned (or trusts)."""


def parse_ids(text: str | Iterable[str] | None, what: str) -> frozenset[str]:
    """Bundle ids from a comma-separated string or a list; CliError for a malformed one."""
    if text is None:
        return frozenset()
    items = text.split(",") if isinstance(text, str) else list(text)
    ids = {s.strip().lower() for s in items if s.strip()}
    bad = [s for s in ids if not _BUNDLE_ID.match(s)]
    if bad:
        raise CliError(f"{what}: {bad[0]!r} is not a bundle id (64 hex digits)")
    return frozenset(ids)


def trusted_from_env() -> frozenset[str]:
    return parse_ids(os.environ.get(TRUSTED_ENV), f"${TRUSTED_ENV}")


def server_key(server: str, model_id: str) -> str:
    """``scheme://host:port/path|model``: one pin per service and model."""
    u = urlsplit(server.strip())
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme.lower()}://{(u.hostname or '').lower()}{port}{u.path.rstrip('/')}|{model_id}"


def _server_of(key: str) -> str:
    return key.rsplit("|", 1)[0]


class Pins:
    """The pins file: ``{"version": 1, "pins": {server_key: bundle_id}}``; ``path`` is
    resolved once (a symlink's target is what is read and replaced)."""

    def __init__(self, path: Path):
        self.given = Path(path)
        self.path = Path(os.path.realpath(path))
        if self.path.is_dir():
            raise CliError(f"{path}: is a directory, not a privbert pins file")

    def _check_private(self) -> None:
        """Refuse a pins file others can write (they could pin a bundle of theirs), warn
        about one others can read (it tells which services this device uses)."""
        try:
            mode = stat.S_IMODE(os.stat(self.path).st_mode)
        except FileNotFoundError:
            return
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CliError(f"{self.path}: the bundle pins are writable by others (mode "
                           f"{mode:o}): another user could pin a bundle of theirs; chmod 600 "
                           f"{self.path}")
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            warn(f"{self.path}: the bundle pins are readable by others (mode {mode:o}): they "
                 f"can see which services this device uses; chmod 600 {self.path}")

    def read(self) -> dict[str, str]:
        self._check_private()
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CliError(f"{self.path}: the bundle pins cannot be read "
                           f"({exc.strerror or type(exc).__name__})") from None
        try:
            data = json.loads(raw)
            pins = data["pins"]
            if data.get("version") != 1 or not isinstance(pins, dict) or not all(
                    isinstance(v, str) and _BUNDLE_ID.match(v) for v in pins.values()):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            raise CliError(f"{self.path}: not a privbert pins file; move it away to pin "
                           "bundles afresh (the next bundle each server names is accepted)"
                           ) from None
        return dict(pins)

    def write(self, pins: dict[str, str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".pins.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:  # mkstemp creates it 0600
                json.dump({"version": 1, "pins": pins}, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def check_pin(pins: Pins, server: str, model_id: str, bundle_id: str, *,
              accept: frozenset[str] = frozenset(),
              trusted: frozenset[str] = frozenset(), record: bool = True,
              served: Iterable[str] | None = None) -> str:
    """Pin ``bundle_id`` for (server, model) on first use, or check it against the pin.

    Returns "pinned" (first use), "same" or "accepted" (the user accepted a change with
    ``accept``, or the app trusts the bundle); raises :class:`BundleChanged` (one line, both
    ids) otherwise. ``served``: the model ids the server serves now; a model seen for the
    first time while a model pinned at this server is no longer served, with a bundle none
    of this server's pins names, is a rename and refused the same way. With
    ``record=False`` nothing is written (the check made before the bundle is fetched; the
    pin is recorded once the bundle has been verified).
    """
    key = server_key(server, model_id)
    current = pins.read()
    old = current.get(key)
    if old == bundle_id:
        return "same"
    agreed = bundle_id in accept or bundle_id in trusted
    if old is not None and not agreed:
        raise BundleChanged(PIN_CHANGED.format(model_id=model_id, server=server,
                                               bundle_id12=bundle_id[:12], pinned12=old[:12],
                                               bundle_id=bundle_id))
    if old is None and not agreed and served is not None:
        here = {k.rsplit("|", 1)[1]: v for k, v in current.items()
                if _server_of(k) == _server_of(key)}
        gone = sorted(m for m in here if m not in set(served))
        if gone and bundle_id not in here.values():
            raise BundleChanged(PIN_RENAMED.format(
                server=server, model_id=model_id, bundle_id12=bundle_id[:12], gone=gone[0],
                pinned12=here[gone[0]][:12], bundle_id=bundle_id))
    if record:
        current[key] = bundle_id
        pins.write(current)
    return "pinned" if old is None else "accepted"
