"""The device's privacy budget ledger: what this device has sent, composed (``shared.ledger``),
checked against the user's cap before anything is written or sent.

One SQLite file (WAL journal, ``synchronous = FULL``): ``--ledger FILE``, else
``$PRIVBERT_LEDGER``, else ``ledger.sqlite3`` in the user's data directory (platformdirs,
e.g. ``~/.local/share/privbert``), created with mode 0600 in a 0700 folder. Tables:

* ``settings``: the lifetime ``cap`` and the optional ``per_day`` cap (worst-case ε);
* ``spend``: per family, the worst-case ε, the dχ metric total η·n and tokens, and sends;
* ``charges``: one row per charged batch (time, mechanism, parameters, bundle, cost), for
  the per-day window and for the record; no text, no payload;
* ``memo``: HMAC of a text (``edge_agent.memo``) -> the payload JSON sent for it.

A charge is one ``BEGIN IMMEDIATE`` transaction: it takes SQLite's write lock, so
concurrent processes on one ledger check and charge one after the other and never pass the
cap together; the memo is read inside it, and the payloads of new texts are stored in it.
It is committed (and on disk: FULL) before the caller writes or sends anything, so a crash
after it over-counts, never under-counts.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.errors import BudgetRefused, CliError
from edge_agent.memo import MemoKeys, key_path, load_secret
from shared import ledger
from shared.ledger import NO_EPSILON, Cost, FamilySpend, Spend

LEDGER_ENV = "PRIVBERT_LEDGER"
DAY_S = 86_400.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value REAL);
CREATE TABLE IF NOT EXISTS spend (family TEXT PRIMARY KEY, epsilon REAL,
    metric REAL NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    sends INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, at REAL NOT NULL,
    family TEXT NOT NULL, mechanism TEXT NOT NULL, params TEXT NOT NULL,
    bundle_id TEXT NOT NULL, epsilon REAL, metric REAL NOT NULL, tokens INTEGER NOT NULL,
    sends INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS charges_at ON charges (at);
CREATE TABLE IF NOT EXISTS memo (key BLOB PRIMARY KEY, payload BLOB NOT NULL) WITHOUT ROWID;
"""
_ADD = ("INSERT INTO spend (family, epsilon, metric, tokens, sends) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (family) DO UPDATE SET epsilon = epsilon + excluded.epsilon, "
        "metric = metric + excluded.metric, tokens = tokens + excluded.tokens, "
        "sends = sends + excluded.sends")


def fmt(eps: float | None) -> str:
    """A worst-case ε for a message."""
    if eps is None:
        return "none"
    return f"{eps:,.1f}" if eps >= 100 else f"{eps:.4g}"


def default_path() -> Path:
    """$PRIVBERT_LEDGER, else ``ledger.sqlite3`` in the user's data directory."""
    env = os.environ.get(LEDGER_ENV)
    if env:
        return Path(env)
    from platformdirs import user_data_path

    return user_data_path("privbert", appauthor=False) / "ledger.sqlite3"


@dataclass
class Status:
    """What the ledger holds now."""

    path: Path
    cap: float | None
    per_day: float | None
    spend: Spend
    day_spent: float
    memoized: int = 0

    @property
    def spent(self) -> float:
        return self.spend.total

    @property
    def remaining(self) -> float | None:
        return ledger.remaining(self.spent, self.cap)

    def to_json(self) -> dict:
        fams = {name: {"epsilon": f.epsilon, "metric": f.metric, "tokens": f.tokens,
                       "sends": f.sends} for name, f in sorted(self.spend.families.items())}
        out = {"ledger": str(self.path), "units": "worst-case epsilon", "spent": self.spent,
               "cap": self.cap, "remaining": self.remaining, "sends": self.spend.sends,
               "families": fams, "memoized": self.memoized, "per_day": None}
        if self.per_day is not None:
            out["per_day"] = {"cap": self.per_day, "spent_last_24h": self.day_spent,
                              "remaining": ledger.remaining(self.day_spent, self.per_day),
                              "note": "a daily cap is not a lifetime bound"}
        return out


@dataclass
class Charged:
    """A batch after :meth:`DeviceLedger.charge`: the payload JSON to send for each item
    (stored ones for memoized texts), what was charged (None: nothing), how many were
    memoized."""

    payloads: list[bytes]
    cost: Cost | None
    memoized: int = 0
    status: Status | None = field(default=None, repr=False)


class DeviceLedger:
    """``DeviceLedger.open(path)``; thread-confined (one connection, used by one thread)."""

    def __init__(self, path: Path, busy_timeout_s: float = 60.0):
        self.path = Path(path)
        self._secret: bytes | None = None
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s,
                                       isolation_level=None, check_same_thread=False)
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            _wal(self._db, busy_timeout_s)
            self._db.execute("PRAGMA synchronous = FULL")
            with self._write() as db:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
        except (OSError, sqlite3.Error) as exc:
            raise CliError(f"{self.path}: cannot open the privacy ledger "
                           f"({getattr(exc, 'strerror', None) or exc})") from None

    @classmethod
    def open(cls, path: str | os.PathLike | None = None) -> DeviceLedger:
        return cls(Path(path) if path else default_path())

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> DeviceLedger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- transactions --------------------------------------------------------------------------
    class _Tx:
        def __init__(self, db: sqlite3.Connection):
            self.db = db

        def __enter__(self):
            self.db.execute("BEGIN IMMEDIATE")  # the write lock, before anything is read
            return self.db

        def __exit__(self, kind, exc, tb) -> None:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")

    def _write(self) -> DeviceLedger._Tx:
        return DeviceLedger._Tx(self._db)

    # -- reading -------------------------------------------------------------------------------
    def _setting(self, name: str) -> float | None:
        row = self._db.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]

    def _status(self, now: float, memo_count: bool = False) -> Status:
        spend = Spend()
        for fam, eps, metric, tokens, sends in self._db.execute(
                "SELECT family, epsilon, metric, tokens, sends FROM spend ORDER BY family"):
            spend.families[fam] = FamilySpend(None if fam in NO_EPSILON else eps, metric,
                                              tokens, sends)
        per_day = self._setting("per_day")
        day = 0.0
        if per_day is not None:
            day = self._db.execute("SELECT COALESCE(SUM(epsilon), 0) FROM charges WHERE at > ?",
                                   (now - DAY_S,)).fetchone()[0]
        memoized = (self._db.execute("SELECT count(*) FROM memo").fetchone()[0]
                    if memo_count else 0)
        return Status(self.path, self._setting("cap"), per_day, spend, float(day), memoized)

    def status(self) -> Status:
        """Spent per family and in total, caps, what the last 24 hours spent, memo size."""
        self._db.execute("BEGIN")
        try:
            return self._status(time.time(), memo_count=True)
        finally:
            self._db.execute("COMMIT")

    def memo_keys(self, setting: dict) -> MemoKeys:
        """Memo keys for ``setting`` with this device's secret (made at first use)."""
        if self._secret is None:
            self._secret = load_secret(key_path(self.path))
        return MemoKeys(self._secret, setting)

    def lookup(self, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """Stored payloads of those ``keys`` that are memoized (a read, no lock)."""
        out: dict[bytes, bytes] = {}
        uniq = list(dict.fromkeys(keys))
        for s in range(0, len(uniq), 500):
            part = uniq[s:s + 500]
            out.update(self._db.execute(
                f"SELECT key, payload FROM memo WHERE key IN ({','.join('?' * len(part))})",
                part).fetchall())
        return out

    # -- settings ------------------------------------------------------------------------------
    def set_cap(self, name: str, cap: float | None) -> None:
        """Set (or with None remove) the ``cap`` or the ``per_day`` cap, in worst-case ε."""
        if name not in ("cap", "per_day"):
            raise ValueError(f"no cap named {name!r}")
        cap = ledger.check_cap(cap)
        with self._write() as db:
            if cap is None:
                db.execute("DELETE FROM settings WHERE name = ?", (name,))
            else:
                db.execute("INSERT INTO settings (name, value) VALUES (?, ?) ON CONFLICT "
                           "(name) DO UPDATE SET value = excluded.value", (name, cap))

    # -- the check-and-charge --------------------------------------------------------------------
    def refusal(self, st: Status, cost: Cost, what: str) -> str | None:
        """Why the filter refuses ``cost`` on top of ``st`` (None: it fits)."""
        eps = cost.epsilon
        if st.cap is None and st.per_day is None:
            return None
        if eps is None:
            return (f"{cost.family} has no differential-privacy epsilon, and this ledger has a "
                    "cap: it cannot admit it (edge-agent budget --cap none removes the cap)")
        if not ledger.fits(st.spent, eps, st.cap):
            return (f"privacy budget: spent {fmt(st.spent)}, {what} needs {fmt(eps)}, cap "
                    f"{fmt(st.cap)} (worst-case epsilon; edge-agent budget)")
        if not ledger.fits(st.day_spent, eps, st.per_day):
            return (f"privacy budget: spent {fmt(st.day_spent)} in the last 24 hours, {what} "
                    f"needs {fmt(eps)}, per-day cap {fmt(st.per_day)} (worst-case epsilon; "
                    "edge-agent budget)")
        return None

    def check(self, cost: Cost | None, what: str = "this run") -> Status:
        """BudgetRefused if ``cost`` would not fit now (nothing is spent)."""
        st = self.status()
        if cost is not None and (why := self.refusal(st, cost, what)) is not None:
            raise BudgetRefused(why)
        return st

    def charge(self, costs: Sequence[Cost], payloads: Sequence[bytes],
               keys: Sequence[bytes | None], *, mechanism: str, params: dict,
               bundle_id: str, what: str = "this batch") -> Charged:
        """Charge one batch in one transaction and return what to send.

        ``payloads[i]`` is the fresh payload JSON of item i, ``costs[i]`` its cost, and
        ``keys[i]`` its memo key (None: not memoized). An item whose key is stored gets the
        stored payload and costs nothing; the first item of a new key is charged and its
        payload stored, later items of that key in the batch get the same payload. The
        filter refuses the whole batch (BudgetRefused, nothing spent or stored) if the
        charged cost does not fit."""
        if not len(costs) == len(payloads) == len(keys):
            raise ValueError("one cost, payload and key per item")
        with self._write() as db:
            stored = self.lookup([k for k in keys if k is not None])
            out: list[bytes] = []
            charged: list[Cost] = []
            new: dict[bytes, bytes] = {}
            for c, p, k in zip(costs, payloads, keys, strict=True):
                if k is not None and k in stored:
                    out.append(stored[k])
                elif k is not None and k in new:
                    out.append(new[k])
                else:
                    out.append(p)
                    charged.append(c)
                    if k is not None:
                        new[k] = p
            cost = ledger.total(charged)
            if cost is None:
                return Charged(out, None, len(out))
            now = time.time()
            st = self._status(now)
            why = self.refusal(st, cost, what)
            if why is not None:
                raise BudgetRefused(why)
            eps = cost.epsilon
            db.execute("INSERT INTO charges (at, family, mechanism, params, bundle_id, epsilon, "
                       "metric, tokens, sends) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (now, cost.family, mechanism, json.dumps(params, sort_keys=True),
                        bundle_id, eps, cost.metric, cost.tokens, cost.sends))
            db.execute(_ADD, (cost.family, eps, cost.metric, cost.tokens, cost.sends))
            if new:
                db.executemany("INSERT OR IGNORE INTO memo (key, payload) VALUES (?, ?)",
                               list(new.items()))
            return Charged(out, cost, len(out) - len(charged))


def _wal(db: sqlite3.Connection, timeout_s: float) -> None:
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
