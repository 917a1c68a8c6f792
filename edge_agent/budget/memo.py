"""Memoization keys (RAPPOR's lesson, Erlingsson et al. 2014 §3): the same input, with the
same mechanism, parameters and bundle, gets the payload stored the first time, so repeating
it tells the server nothing new and costs nothing more.

The key is what is sent, not the raw line: the token ids after the tokenizer's
normalization and the length policy (with word dropout, also each piece's word), so every
spelling that tokenizes alike (spaces, Unicode normal forms, case for an uncased model,
zero-width and soft-hyphen characters, a BOM, a non-breaking space) gets the same stored
payload, and fresh draws of the same ids, what an averaging attack needs, are never made.
The vector mechanisms are keyed the same way, on their encoder's input ids. Other
implementations of the edge (web_edge/) key their memo by the same rule.

The ledger never stores the text: it stores HMAC-SHA256(secret, settings ‖ ids), with a
per-device secret of 32 random bytes made at first use and kept beside the ledger with
mode 0600 (``FILE.key``, next to the ledger's real path). Without the secret the hashes say
nothing about the texts; with it, anyone can test a guessed text, so the secret is refused
when others can read it.
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

import numpy as np

from edge_agent.errors import CliError

SECRET_BYTES = 32  # which budget families are memoized: shared.ledger.BudgetFamily.memo


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
    if stat.S_ISDIR(st.st_mode):
        raise CliError(f"{path}: is a directory, not the ledger's memo key; move it away (a "
                       "new key is then made, and memoized payloads are forgotten)")
    if not stat.S_ISREG(st.st_mode):
        raise CliError(f"{path}: is not a regular file, so not the ledger's memo key; move it "
                       "away")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CliError(f"{path}: the ledger's memo key is readable by others (mode "
                       f"{stat.S_IMODE(st.st_mode):o}); chmod 600 it")
    data = Path(path).read_bytes()
    if len(data) != SECRET_BYTES:
        raise CliError(f"{path}: not a ledger memo key ({len(data)} bytes, expected "
                       f"{SECRET_BYTES}); move it away to make a new one (memoized payloads "
                       "are then forgotten)")
    return data


def _prefix(secret: bytes, setting: dict, version: bytes) -> hmac.HMAC:
    prefix = version + json.dumps(setting, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret, struct.pack("<Q", len(prefix)) + prefix, hashlib.sha256)


class MemoKeys:
    """HMAC keys of tokenized inputs for one setting: mechanism, parameters and bundle
    (what else shapes a payload, its float dtype, does not change what it reveals: a stored
    payload is sent whatever dtype a later run asks for)."""

    def __init__(self, secret: bytes, setting: dict):
        self._base = _prefix(secret, setting, b"ids/2:")

    def key(self, item) -> bytes:
        """The key of a ``privatizer.TokenizedText``: its ids (and words, when kept)."""
        h = self._base.copy()
        for part in (item.ids_a, item.ids_b, item.words_a, item.words_b):
            if part is None:
                h.update(b"\xff")
            else:
                b = np.ascontiguousarray(part, dtype="<i8").tobytes()
                h.update(b"\x00" + struct.pack("<Q", len(b)) + b)
        return h.digest()


class LegacyMemoKeys:
    """The raw-text keys of ledgers of version 1 (read for the texts they memoized)."""

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
