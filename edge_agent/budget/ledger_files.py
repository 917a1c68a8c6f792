"""Where a device ledger lives and who may touch it: the path with its symlinks resolved
(so the memo key beside it is found wherever the ledger is reached from), a private file
(0600: another local user who can write it could reset its spend or cap, one who can read
it learns what and when this device sent), and a read-only opening for ``edge-agent
budget`` on a ledger it cannot write.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from pathlib import Path
from urllib.parse import quote

from edge_agent.errors import CliError, warn


def resolved(path: Path) -> Path:
    """``path`` with every symlink resolved; CliError for a directory."""
    real = Path(os.path.realpath(path))
    if real.is_dir():
        raise CliError(f"{path}: is a directory, not a privacy ledger file (--ledger FILE)")
    return real


def check_private(path: Path) -> None:
    """Refuse a ledger others can write (with the one-line fix), warn about one others can
    read. A missing file is fine (it is created 0600)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CliError(f"{path}: the privacy ledger is writable by others (mode {mode:o}): "
                       f"another user could reset its spend or cap; chmod 600 {path}")
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        warn(f"{path}: the privacy ledger is readable by others (mode {mode:o}): they can see "
             f"what this device sent and when; chmod 600 {path}")


def open_read_only(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """A read-only connection to an existing ledger (nothing is created or migrated)."""
    db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=busy_timeout_s,
                         isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    db.execute("SELECT count(*) FROM sqlite_master").fetchone()  # fails now, not later
    return db


def wal(db: sqlite3.Connection, timeout_s: float) -> None:
    """WAL mode (persistent; only the first connection of a new file changes it). The
    change needs an exclusive lock and SQLite answers "locked" at once instead of waiting
    when processes open a new ledger together: retry until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            if db.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() == "wal":
                return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise sqlite3.OperationalError("could not switch the ledger to WAL")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)

