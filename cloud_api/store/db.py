"""The database: one SQLAlchemy 2 engine, transactions, Alembic migrations, and errors.

    db = Database.from_settings(settings)   # sqlite:///$PRIVBERT_HOME/privbert.db by default
    db.upgrade()                            # Alembic, to head (`cloud-api db upgrade`)
    with db.begin(write=True) as conn:      # Core connection in one transaction
        conn.execute(...)
    with db.session() as s:                 # the same, as an ORM Session
        s.execute(...)

SQLite: a database file of mode 0600 (:func:`private_sqlite_file`; records, budgets and
key ids are nobody else's to read), WAL journal, ``busy_timeout``, foreign keys on, and
``BEGIN IMMEDIATE`` for
``write=True`` transactions (the write lock is taken at the start, so a read-then-write
cannot race another writer). PostgreSQL: psycopg 3 (``postgresql+psycopg://``), a connect
timeout, and pool pre-ping. SQL parameters (payload bytes, idempotency keys) never appear
in an error message, and so never in a log (``hide_parameters``). Every failure to reach
the database (refused, timed out, locked, dropped mid-query) raises
:class:`cloud_api.errors.Unavailable` (503), never a 500; a full database or disk raises
:class:`cloud_api.errors.InsufficientStorage` (507), which waiting will not mend; pre-ping and SQLAlchemy's pool
invalidation mean no broken connection is reused, so the service recovers by itself when
the database comes back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session

from cloud_api.errors import InsufficientStorage, Unavailable
from cloud_api.settings import Settings

log = logging.getLogger(__name__)

MIGRATIONS = "cloud_api.store:migrations"  # Alembic script location inside the package
_LOCK_ID = 0x70726976  # PostgreSQL advisory lock id held while migrating ("priv")
RETRY_AFTER_S = 2.0


_OUTAGE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)


def _is_outage(exc: BaseException) -> bool:
    """True for errors that mean "the database cannot be reached or used right now"."""
    if isinstance(exc, _OUTAGE):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and bool(exc.connection_invalidated)


def _is_full(exc: BaseException) -> bool:
    """True for "the database or its disk is full": SQLite's SQLITE_FULL, PostgreSQL's
    disk_full (SQLSTATE 53100)."""
    import sqlite3

    orig = getattr(exc, "orig", None) or exc
    if getattr(orig, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return True
    return getattr(orig, "sqlstate", None) == "53100"


def _reason(exc: BaseException) -> str:
    """One short line about an outage for the log (driver message, never SQL parameters)."""
    orig = getattr(exc, "orig", None) or exc
    first = (str(orig).strip().splitlines() or [""])[0]
    return f"{type(orig).__name__}: {first[:200]}"


def private_sqlite_file(path: str) -> None:
    """A SQLite database file readable by its owner only (0600): made so before SQLite
    opens it (SQLite makes its -wal and -shm files with the database file's mode), and an
    older one with group or other bits has them taken off (logged). Its folder is made
    where missing."""
    import os
    import stat
    from pathlib import Path

    db = Path(path)
    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return  # an empty file is an empty SQLite database
    except FileExistsError:
        pass
    for f in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        try:
            mode = stat.S_IMODE(f.stat().st_mode)
            if mode & 0o077:
                os.chmod(f, mode & 0o700)
                log.warning("%s was readable by others (mode %o): now %o", f, mode,
                            mode & 0o700)
        except FileNotFoundError:
            continue
        except PermissionError as exc:  # someone else's file: say so, SQLite decides
            log.warning("%s is mode %o and cannot be made private: %s", f, mode, exc)


class Database:
    """An engine for ``url`` with the settings above; thread-safe; one per process."""

    def __init__(self, url: str, *, busy_timeout_s: float = 5.0, connect_timeout_s: float = 5.0,
                 pool_size: int = 5, auto_upgrade: bool | None = None, echo: bool = False):
        u = make_url(url)
        self.dialect = u.get_backend_name()
        if self.dialect not in ("sqlite", "postgresql"):
            raise ValueError(f"database URL must be sqlite:///FILE or postgresql+psycopg://..., "
                             f"got a {self.dialect} URL")
        if self.dialect == "postgresql" and u.drivername == "postgresql":
            u = u.set(drivername="postgresql+psycopg")  # psycopg 3, not psycopg2
        self.url = u
        self.auto_upgrade = (self.dialect == "sqlite") if auto_upgrade is None else auto_upgrade
        if self.dialect == "sqlite":
            if u.database and u.database != ":memory:":
                private_sqlite_file(u.database)
            self.engine = create_engine(u, echo=echo, pool_pre_ping=True, hide_parameters=True,
                                        connect_args={"timeout": busy_timeout_s})
            _sqlite_events(self.engine, int(busy_timeout_s * 1000))
        else:
            self.engine = create_engine(
                u, echo=echo, pool_pre_ping=True, hide_parameters=True, pool_size=pool_size,
                max_overflow=pool_size, pool_timeout=connect_timeout_s,
                connect_args={"connect_timeout": max(1, round(connect_timeout_s)),
                              "application_name": "privbert"})
        self._writer = self.engine.execution_options(privbert_begin="IMMEDIATE")
        # the same errors raised by the driver itself, where we use it directly (COPY)
        driver = self.engine.dialect.loaded_dbapi
        self._driver_outage = (driver.OperationalError, driver.InterfaceError)

    @classmethod
    def from_settings(cls, s: Settings) -> Database:
        return cls(s.resolved_database_url, busy_timeout_s=s.db_busy_timeout_s,
                   connect_timeout_s=s.db_connect_timeout_s, pool_size=s.db_pool_size,
                   auto_upgrade=s.db_auto_upgrade)

    def __repr__(self) -> str:
        return f"Database({self.url.render_as_string(hide_password=True)!r})"

    # -- transactions ------------------------------------------------------------------------
    @contextmanager
    def begin(self, *, write: bool = False) -> Iterator[Connection]:
        """A Core connection in one transaction: committed when the block ends, rolled back
        on an exception. ``write=True`` takes SQLite's write lock at BEGIN (IMMEDIATE).
        An outage raises :class:`Unavailable`."""
        engine = self._writer if write else self.engine
        with self.outage_as_unavailable(), engine.begin() as conn:
            yield conn

    def write_connection(self) -> Connection:
        """A Core connection of its own for a writer that keeps it across transactions
        (``with conn.begin():`` takes SQLite's write lock at BEGIN, as :meth:`begin` with
        ``write=True``); the caller closes it."""
        with self.outage_as_unavailable():
            return self._writer.connect()

    @contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """An ORM :class:`Session` in one transaction (see :meth:`begin`)."""
        with self.begin(write=write) as conn, Session(bind=conn) as s:
            yield s
            s.flush()

    @contextmanager
    def outage_as_unavailable(self) -> Iterator[None]:
        """Turn "database unreachable" errors raised in the block into :class:`Unavailable`."""
        try:
            yield
        except (sa_exc.SQLAlchemyError, *self._driver_outage) as exc:
            if _is_full(exc):
                log.warning("database full (%s)", _reason(exc))
                raise InsufficientStorage("the database has no space left: nothing of this "
                                          "request was stored; an operator must free space "
                                          "(or raise the database's size limit)") from None
            if not (_is_outage(exc) or isinstance(exc, self._driver_outage)):
                raise
            log.warning("database unavailable (%s)", _reason(exc))
            raise Unavailable("the database is unavailable; try again later",
                              retry_after=RETRY_AFTER_S) from None

    def ping(self) -> None:
        """One round trip (``SELECT 1``); :class:`Unavailable` when it fails."""
        with self.begin() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        """Close every pooled connection (at shutdown)."""
        self.engine.dispose()

    # -- migrations --------------------------------------------------------------------------
    def _alembic_config(self, conn: Connection | None = None):
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", MIGRATIONS)
        cfg.attributes["connection"] = conn
        return cfg

    def head(self) -> str | None:
        """The newest revision the code knows (the migrations folder's head)."""
        from alembic.script import ScriptDirectory

        return ScriptDirectory.from_config(self._alembic_config()).get_current_head()

    def current(self) -> str | None:
        """The revision the database is at (None: empty, never migrated)."""
        from alembic.runtime.migration import MigrationContext

        with self.begin() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def upgrade(self, revision: str = "head") -> str | None:
        """Apply migrations up to ``revision`` and return the revision reached. Safe when
        several processes start at once: SQLite serializes them with BEGIN IMMEDIATE,
        PostgreSQL with an advisory lock; the later ones find nothing left to do."""
        from alembic import command

        return self._migrate(command.upgrade, revision)

    def downgrade(self, revision: str) -> str | None:
        """Undo migrations down to ``revision`` (``"base"``: an empty database)."""
        from alembic import command

        return self._migrate(command.downgrade, revision)

    def _migrate(self, alembic_command, revision: str) -> str | None:
        """Run an Alembic command in one write transaction (PostgreSQL: under the advisory
        lock); the revision reached."""
        with self.begin(write=True) as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_ID})
            alembic_command(self._alembic_config(conn), revision)
        return self.current()

    def prepare(self) -> None:
        """At server start: upgrade when :attr:`auto_upgrade`, otherwise check that the
        database is at the code's head (RuntimeError with the command to run if not). A
        database that cannot be reached now is logged and left for later (requests get
        503 until it answers)."""
        try:
            if self.auto_upgrade:
                self.upgrade()
                return
            current, head = self.current(), self.head()
        except Unavailable:
            log.warning("database not reachable at start; record routes answer 503 until it is")
            return
        if current != head:
            raise RuntimeError(f"database is at revision {current or 'none (empty)'}, this "
                               f"code needs {head}: run `cloud-api db upgrade` (or set "
                               "PRIVBERT_DB_AUTO_UPGRADE=1)")


def _sqlite_events(engine: Engine, busy_ms: int) -> None:
    """Pragmas on every new SQLite connection, and our own BEGIN (pysqlite's is off)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cur.execute("PRAGMA foreign_keys = ON")
            _ensure_wal(cur, busy_ms / 1000)
            cur.execute("PRAGMA synchronous = FULL")  # an answered request is on disk
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("privbert_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")


def _ensure_wal(cur, timeout_s: float) -> None:
    """Put the database file in WAL mode (persistent, so only the first connection of a new
    file changes it). The change needs an exclusive lock, and SQLite answers "database is
    locked" at once instead of calling the busy handler when another connection holds one
    (several processes creating the database together), so retry until ``timeout_s``."""
    import sqlite3
    import time

    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            mode = cur.execute("PRAGMA journal_mode").fetchone()[0].lower()
            if mode in ("wal", "memory"):  # ":memory:" databases have no WAL
                return
            # a refused change may also come back as the old mode instead of an error
            mode = cur.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower()
            if mode == "wal":
                return
            if time.monotonic() + delay > deadline:
                raise sqlite3.OperationalError(f"could not switch to WAL (still {mode})")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
