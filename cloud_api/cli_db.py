"""``cloud-api db upgrade | current``: the record store's schema (Alembic migrations).

    cloud-api db upgrade                 # to head; safe to run from several hosts at once
    cloud-api db current [--check]       # the database's revision and the code's head

The database is ``--database-url``, else ``$PRIVBERT_DATABASE_URL``, else the SQLite file
``$PRIVBERT_HOME/privbert.db``. ``cloud-api serve`` applies migrations itself for SQLite
(and for PostgreSQL only with ``PRIVBERT_DB_AUTO_UPGRADE=1``); with PostgreSQL run
``cloud-api db upgrade`` once per release before starting the replicas.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from cloud_api.cli import fail, guarded, home_arg, settings_for
from cloud_api.store.db import Database
from models.cli.options import parsed


@dataclass(frozen=True)
class UpgradeOptions:
    """``cloud-api db upgrade``."""

    database_url: str | None
    home: str | None
    revision: str


@dataclass(frozen=True)
class CurrentOptions:
    """``cloud-api db current``."""

    database_url: str | None
    home: str | None
    check: bool


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="database schema: upgrade | current",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    dsub = p.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = dsub.add_parser("upgrade", help="apply the migrations up to head (or --revision)")
    up.add_argument("--revision", default="head", help="target revision (head)")
    up.set_defaults(func=guarded(run_upgrade, parsed(UpgradeOptions)))
    cur = dsub.add_parser("current", help="the revision the database is at, and the head")
    cur.add_argument("--check", action="store_true", help="exit 1 unless at head")
    cur.set_defaults(func=guarded(run_current, parsed(CurrentOptions)))
    for q in (up, cur):
        q.add_argument("--database-url", metavar="URL", help="SQLAlchemy URL (default "
                       "$PRIVBERT_DATABASE_URL, else sqlite:///$PRIVBERT_HOME/privbert.db)")
        home_arg(q)


def _database(database_url: str | None, home: str | None) -> Database:
    settings = settings_for(home)
    if database_url:
        settings = settings.model_copy(update={"database_url": database_url})
    return Database.from_settings(settings)


def run_upgrade(o: UpgradeOptions) -> int:
    db = _database(o.database_url, o.home)
    try:
        before = db.current()
        after = db.upgrade(o.revision)
    finally:
        db.dispose()
    what = "already at" if before == after else f"upgraded from {before or 'empty'} to"
    print(f"{db.url.render_as_string(hide_password=True)}: {what} {after}")
    return 0


def run_current(o: CurrentOptions) -> int:
    db = _database(o.database_url, o.home)
    try:
        current, head = db.current(), db.head()
    finally:
        db.dispose()
    state = "up to date" if current == head else "behind: run `cloud-api db upgrade`"
    print(f"{db.url.render_as_string(hide_password=True)}: revision {current or 'none (empty)'}"
          f", head {head} ({state})")
    if o.check and current != head:
        fail("database is not at the code's head revision")
        return 1
    return 0
