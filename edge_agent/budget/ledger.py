"""The device's privacy budget ledger: what this device has sent, composed (``shared.ledger``),
checked against the user's cap before anything is written or sent.

One SQLite file (WAL journal, ``synchronous = FULL``): ``--ledger FILE``, else
``$PRIVBERT_LEDGER``, else ``ledger.sqlite3`` in the user's data directory (platformdirs,
e.g. ``~/.local/share/privbert``), created with mode 0600 in a 0700 folder, reached through
its symlinks resolved; one that others can write is refused, one they can read warned
about (``edge_agent.budget.ledger_files``). Tables (schema version :data:`VERSION` in SQLite's
``user_version``; an older ledger is migrated forward when opened for writing):

* ``settings``: the lifetime ``cap`` and the optional ``per_day`` cap (worst-case ε);
* ``spend``: per family, the worst-case ε, the dχ metric total η·n and tokens, sends, and the
  public words sent under a token policy (``public``: counted, no guarantee, not charged);
* ``charges``: one row per charged batch (time, mechanism, parameters, bundle, cost), for
  the per-day window and for the record; no text, no payload;
* ``memo``: HMAC of what is sent, the token ids after the tokenizer's normalization
  (``edge_agent.budget.memo``) -> the payload JSON sent for them; ``memo_text`` (ledgers of version
  1 only): the same keyed on the raw text, read for texts memoized before the migration;
* ``clock``: the latest time the ledger has seen; ``clock_anchors``: per epoch of the
  monotonic clock (a boot, or a process), the ledger's time and the clock's reading at its
  last charge there.

The per-day window reads the ledger's time (``edge_agent.budget.clock``): the latest time seen
plus what the monotonic clock says has passed, so a wall clock set forward opens no fresh
window, one set back reopens no old one, and neither refuses anything; only in an epoch the
ledger has not seen (after a reboot) is the wall clock trusted forward.

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

from edge_agent.budget.clock import Anchor, Clock, Reading, ledger_time, system_clock
from edge_agent.budget.ledger_files import check_private, open_read_only, resolved, wal
from edge_agent.budget.memo import LegacyMemoKeys, MemoKeys, key_path, load_secret
from edge_agent.errors import BudgetRefused, CliError
from shared import ledger
from shared import messages as msg
from shared.conventions import DAY_S, MAX_ANCHORS
from shared.conventions import fmt_eps as fmt
from shared.ledger import Cost, FamilySpend, Spend, families

LEDGER_ENV = "PRIVBERT_LEDGER"
VERSION = 4  # 1: the ledgers written before user_version was set (memo keyed on raw text);
# 2: one clock anchor (the boot of the last charge) in ``clock``; 3: ``clock_anchors``;
# 4: ``public`` in ``spend`` and ``charges`` (a token policy's public words)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value REAL);
CREATE TABLE IF NOT EXISTS spend (family TEXT PRIMARY KEY, epsilon REAL,
    metric REAL NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    sends INTEGER NOT NULL DEFAULT 0, public INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, at REAL NOT NULL,
    family TEXT NOT NULL, mechanism TEXT NOT NULL, params TEXT NOT NULL,
    bundle_id TEXT NOT NULL, epsilon REAL, metric REAL NOT NULL, tokens INTEGER NOT NULL,
    sends INTEGER NOT NULL, public INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS charges_at ON charges (at);
CREATE TABLE IF NOT EXISTS memo (key BLOB PRIMARY KEY, payload BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS clock (id INTEGER PRIMARY KEY CHECK (id = 1), latest REAL NOT NULL,
    boot_id TEXT, boot_at REAL);
CREATE TABLE IF NOT EXISTS clock_anchors (epoch TEXT PRIMARY KEY, at REAL NOT NULL,
    reading REAL NOT NULL) WITHOUT ROWID;
"""
_CLOCK = ("INSERT INTO clock (id, latest) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET "
          "latest = max(latest, excluded.latest)")
_ANCHOR = ("INSERT INTO clock_anchors (epoch, at, reading) VALUES (?, ?, ?) ON CONFLICT (epoch) "
           "DO UPDATE SET at = excluded.at, reading = excluded.reading")
_PRUNE = ("DELETE FROM clock_anchors WHERE epoch NOT IN (SELECT epoch FROM clock_anchors "
          f"ORDER BY at DESC LIMIT {MAX_ANCHORS})")
_ADD = ("INSERT INTO spend (family, epsilon, metric, tokens, sends, public) VALUES "
        "(?, ?, ?, ?, ?, ?) ON CONFLICT (family) DO UPDATE SET epsilon = epsilon + "
        "excluded.epsilon, metric = metric + excluded.metric, tokens = tokens + "
        "excluded.tokens, sends = sends + excluded.sends, public = public + excluded.public")


TOOL = "edge-agent budget"  # the command that shows the ledger and sets its caps


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
                       "sends": f.sends, **({"public": f.public} if f.public else {})}
                for name, f in sorted(self.spend.families.items())}
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
    """``DeviceLedger.open(path)``; thread-confined (one connection, used by one thread).
    ``read_only_ok``: a ledger that cannot be opened for writing is opened read-only
    (``edge-agent budget`` showing it); charging it then fails. ``clock``: the monotonic
    clock of the per-day window (default: this system's, ``edge_agent.budget.clock``)."""

    def __init__(self, path: Path, busy_timeout_s: float = 60.0, read_only_ok: bool = False,
                 clock: Clock | None = None):
        self.path = resolved(Path(path))
        self.clock = clock if clock is not None else system_clock()
        self._secret: bytes | None = None
        self.read_only = False
        check_private(self.path)
        try:
            self._db = self._open(busy_timeout_s)
        except (OSError, sqlite3.Error) as exc:
            if not (read_only_ok and self.path.is_file()):
                raise CliError(f"{self.path}: cannot open the privacy ledger "
                               f"({getattr(exc, 'strerror', None) or exc})") from None
            try:
                self._db = open_read_only(self.path, busy_timeout_s)
            except sqlite3.Error as again:
                raise CliError(f"{self.path}: cannot read the privacy ledger ({again})"
                               ) from None
            self.read_only = True
        self.version = self._db.execute("PRAGMA user_version").fetchone()[0] or 1
        if self.version > VERSION:
            self._db.close()
            raise CliError(f"{self.path}: this privacy ledger was written by a newer "
                           f"edge-agent (version {self.version}; this one reads up to "
                           f"{VERSION}): upgrade edge-agent")
        self._legacy = bool(self._db.execute(
            "SELECT count(*) FROM sqlite_master WHERE name = 'memo_text'").fetchone()[0])

    def _open(self, busy_timeout_s: float) -> sqlite3.Connection:
        """Read-write, created 0600 in a 0700 folder, migrated to :data:`VERSION`."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                             check_same_thread=False)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            wal(db, busy_timeout_s)
            db.execute("PRAGMA synchronous = FULL")
            with DeviceLedger._Tx(db):
                _migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    @classmethod
    def open(cls, path: str | os.PathLike | None = None, read_only_ok: bool = False
             ) -> DeviceLedger:
        return cls(Path(path) if path else default_path(), read_only_ok=read_only_ok)

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
        epsilon = {f.name: f.epsilon for f in families()}  # a family not registered: as stored
        public = "public" if self.version >= 4 else "0"  # a read-only older ledger
        for fam, eps, metric, tokens, sends, pub in self._db.execute(
                f"SELECT family, epsilon, metric, tokens, sends, {public} FROM spend "
                "ORDER BY family"):
            spend.families[fam] = FamilySpend(eps if epsilon.get(fam, True) else None, metric,
                                              tokens, sends, pub)
        per_day = self._setting("per_day")
        day = 0.0
        if per_day is not None:
            day = self._db.execute("SELECT COALESCE(SUM(epsilon), 0) FROM charges WHERE at > ?",
                                   (now - DAY_S,)).fetchone()[0]
        memoized = 0
        if memo_count:
            memoized = self._db.execute("SELECT count(*) FROM memo").fetchone()[0]
            if self._legacy:
                memoized += self._db.execute("SELECT count(*) FROM memo_text").fetchone()[0]
        return Status(self.path, self._setting("cap"), per_day, spend, float(day), memoized)

    def _clock_state(self) -> tuple[float | None, dict[str, Anchor]]:
        """(the latest time seen, the anchors per epoch), from any schema version (a
        read-only ledger is not migrated)."""
        if self.version < 2:
            return self._db.execute("SELECT max(at) FROM charges").fetchone()[0], {}
        row = self._db.execute("SELECT latest FROM clock").fetchone()
        latest = None if row is None else row[0]
        if self.version == 2:
            boot = self._db.execute("SELECT boot_id, latest, boot_at FROM clock").fetchone()
            has = boot is not None and boot[0] is not None and boot[2] is not None
            return latest, ({boot[0]: Anchor(boot[1], boot[2])} if has else {})
        return latest, {e: Anchor(at, r) for e, at, r in self._db.execute(
            "SELECT epoch, at, reading FROM clock_anchors")}

    def _now(self) -> tuple[float, Reading]:
        """The ledger's time now (``edge_agent.budget.clock.ledger_time``), and the monotonic
        reading it was taken from."""
        reading = self.clock.read()
        latest, anchors = self._clock_state()
        return ledger_time(latest, anchors, reading, time.time()), reading

    def status(self) -> Status:
        """Spent per family and in total, caps, what the last 24 hours spent, memo size."""
        self._db.execute("BEGIN")
        try:
            return self._status(self._now()[0], memo_count=True)
        finally:
            self._db.execute("COMMIT")

    def memo_keys(self, setting: dict) -> MemoKeys:
        """Memo keys for ``setting`` with this device's secret (made at first use)."""
        return MemoKeys(self._memo_secret(), setting)

    def legacy_memo_keys(self, setting: dict) -> LegacyMemoKeys | None:
        """Raw-text keys of a version-1 ledger's memo (None when it has none)."""
        if not self._legacy:
            return None
        return LegacyMemoKeys(self._memo_secret(), setting)

    def _memo_secret(self) -> bytes:
        if self._secret is None:
            self._secret = load_secret(key_path(self.path))
        return self._secret

    def lookup(self, keys: Sequence[bytes], table: str = "memo") -> dict[bytes, bytes]:
        """Stored payloads of those ``keys`` that are memoized (a read, no lock)."""
        out: dict[bytes, bytes] = {}
        if table == "memo_text" and not self._legacy:
            return out
        uniq = list(dict.fromkeys(keys))
        for s in range(0, len(uniq), 500):
            part = uniq[s:s + 500]
            out.update(self._db.execute(
                f"SELECT key, payload FROM {table} WHERE key IN ({','.join('?' * len(part))})",
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
            return msg.BUDGET_NO_EPSILON.format(family=cost.family, tool=TOOL)
        if not ledger.fits(st.spent, eps, st.cap):
            return msg.BUDGET_CAP.format(spent=fmt(st.spent), what=what, needs=fmt(eps),
                                         cap=fmt(st.cap), tool=TOOL)
        if not ledger.fits(st.day_spent, eps, st.per_day):
            return msg.BUDGET_PER_DAY.format(spent=fmt(st.day_spent), what=what, needs=fmt(eps),
                                             cap=fmt(st.per_day), tool=TOOL)
        return None

    def check(self, cost: Cost | None, what: str = "this run") -> Status:
        """BudgetRefused if ``cost`` would not fit now (nothing is spent)."""
        self._db.execute("BEGIN")
        try:
            st = self._status(self._now()[0], memo_count=True)
        finally:
            self._db.execute("COMMIT")
        if cost is not None and (why := self.refusal(st, cost, what)) is not None:
            raise BudgetRefused(why)
        return st

    def charge(self, costs: Sequence[Cost], payloads: Sequence[bytes],
               keys: Sequence[bytes | None], *, mechanism: str, params: dict,
               bundle_id: str, what: str = "this batch",
               legacy: Sequence[bytes | None] | None = None) -> Charged:
        """Charge one batch in one transaction and return what to send.

        ``payloads[i]`` is the fresh payload JSON of item i, ``costs[i]`` its cost, and
        ``keys[i]`` its memo key (None: not memoized). An item whose key is stored gets the
        stored payload and costs nothing; the first item of a new key is charged and its
        payload stored, later items of that key in the batch get the same payload.
        ``legacy[i]``: the item's raw-text key in a version-1 memo, whose payload (if
        stored) is used and stored under the new key, free. The filter refuses the whole
        batch (BudgetRefused, nothing spent or stored) if the charged cost does not fit."""
        if not len(costs) == len(payloads) == len(keys):
            raise ValueError("one cost, payload and key per item")
        if self.read_only:
            raise CliError(f"{self.path}: the privacy ledger is read-only here: nothing can "
                           "be charged, so nothing was written or sent")
        legacy = legacy if legacy is not None else [None] * len(keys)
        with self._write() as db:
            stored = self.lookup([k for k in keys if k is not None])
            old = self.lookup([k for k in legacy if k is not None], "memo_text")
            out: list[bytes] = []
            charged: list[Cost] = []
            new: dict[bytes, bytes] = {}
            for c, p, k, lk in zip(costs, payloads, keys, legacy, strict=True):
                if k is not None and k in stored:
                    out.append(stored[k])
                elif k is not None and k in new:
                    out.append(new[k])
                elif k is not None and lk is not None and lk in old:
                    out.append(old[lk])
                    new[k] = old[lk]
                else:
                    out.append(p)
                    charged.append(c)
                    if k is not None:
                        new[k] = p
            cost = ledger.total(charged)
            if cost is None:
                if new:
                    db.executemany("INSERT OR IGNORE INTO memo (key, payload) VALUES (?, ?)",
                                   list(new.items()))
                return Charged(out, None, len(out))
            now, reading = self._now()
            st = self._status(now)
            why = self.refusal(st, cost, what)
            if why is not None:
                raise BudgetRefused(why)
            eps = cost.epsilon
            db.execute("INSERT INTO charges (at, family, mechanism, params, bundle_id, epsilon, "
                       "metric, tokens, sends, public) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (now, cost.family, mechanism, json.dumps(params, sort_keys=True),
                        bundle_id, eps, cost.metric, cost.tokens, cost.sends, cost.public))
            db.execute(_ADD, (cost.family, eps, cost.metric, cost.tokens, cost.sends,
                              cost.public))
            db.execute(_CLOCK, (now,))
            db.execute(_ANCHOR, (reading.epoch, now, reading.at))
            db.execute(_PRUNE)
            if new:
                db.executemany("INSERT OR IGNORE INTO memo (key, payload) VALUES (?, ?)",
                               list(new.items()))
            return Charged(out, cost, len(out) - len(charged))


def _migrate(db: sqlite3.Connection) -> None:
    """Create or bring the schema to :data:`VERSION` (in the caller's write transaction).
    Version 1 (no user_version): its memo was keyed on the raw text; it is kept, renamed
    ``memo_text``, and read for texts memoized then; the clock starts at its last charge,
    with no anchor. Version 2: the boot of its last charge becomes the first anchor (its
    ``clock`` columns boot_id and boot_at are not read after that)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version >= VERSION:
        return
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version < 2 and "memo" in tables:  # a version-1 ledger
        db.execute("ALTER TABLE memo RENAME TO memo_text")
    for statement in filter(str.strip, _SCHEMA.split(";")):
        db.execute(statement)
    if version < 2 and "charges" in tables:
        latest = db.execute("SELECT max(at) FROM charges").fetchone()[0]
        if latest is not None:
            db.execute(_CLOCK, (latest,))
    if version == 2:
        db.execute("INSERT OR IGNORE INTO clock_anchors (epoch, at, reading) SELECT boot_id, "
                   "latest, boot_at FROM clock WHERE boot_id IS NOT NULL AND boot_at IS NOT NULL")
    for table in ("spend", "charges"):  # version 4: the public words of a token policy
        columns = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        if "public" not in columns:
            db.execute(f"ALTER TABLE {table} ADD COLUMN public INTEGER NOT NULL DEFAULT 0")
    db.execute(f"PRAGMA user_version = {VERSION}")
