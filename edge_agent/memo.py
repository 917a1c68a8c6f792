"""Memoization keys (RAPPOR's lesson, Erlingsson et al. 2014 §3): the same text, with the
same mechanism, parameters and bundle, gets the payload stored the first time, so repeating
it tells the server nothing new and costs nothing more.

The ledger never stores the text: it stores HMAC-SHA256(secret, settings ‖ text), with a
per-device secret of 32 random bytes made at first use and kept beside the ledger with
mode 0600 (``FILE.key``). Without the secret the hashes say nothing about the texts;
with it, anyone can test a guessed text, so the secret is refused when others can read it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import struct
from pathlib import Path

from edge_agent.errors import CliError

SECRET_BYTES = 32
MEMO_FAMILIES = ("dchi", "laplace", "randomized-response")  # TextHide and none: never


def key_path(ledger_path: Path) -> Path:
    return ledger_path.with_name(ledger_path.name + ".key")


def load_secret(path: Path) -> bytes:
    """The device secret at ``path``, made (atomically, mode 0600) when missing."""
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another process made it first: then use theirs
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return _read(path)


def _read(path: Path) -> bytes:
    st = os.stat(path)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CliError(f"{path}: the ledger's memo key is readable by others (mode "
                       f"{stat.S_IMODE(st.st_mode):o}); chmod 600 it")
    data = Path(path).read_bytes()
    if len(data) != SECRET_BYTES:
        raise CliError(f"{path}: not a ledger memo key ({len(data)} bytes, expected "
                       f"{SECRET_BYTES}); move it away to make a new one (memoized payloads "
                       "are then forgotten)")
    return data


class MemoKeys:
    """HMAC keys of texts for one setting (mechanism, parameters, bundle, and what shapes the
    payload: float dtype, length limit, truncation)."""

    def __init__(self, secret: bytes, setting: dict):
        prefix = json.dumps(setting, sort_keys=True, separators=(",", ":")).encode()
        self._base = hmac.new(secret, struct.pack("<Q", len(prefix)) + prefix, hashlib.sha256)

    def key(self, text: str, pair: str | None = None) -> bytes:
        h = self._base.copy()
        for part in (text, pair):
            if part is None:
                h.update(b"\xff")
            else:
                b = part.encode("utf-8", "surrogatepass")
                h.update(b"\x00" + struct.pack("<Q", len(b)) + b)
        return h.digest()
