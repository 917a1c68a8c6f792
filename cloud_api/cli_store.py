"""``cloud-api store import-home | list | sync``: the shared model store (model versions,
promotions and bundles in the database, ``PRIVBERT_MODEL_STORE=database``).

    cloud-api store import-home [--home DIR]   # a home on disk into the store; run it again safely
    cloud-api store list [--json]              # stored versions and promotions
    cloud-api store sync [--home DIR]          # fetch what the store promotes into DIR, checked

The database is ``--database-url``, else ``$PRIVBERT_DATABASE_URL``; it must be at the
code's head (``cloud-api db upgrade``). ``import-home`` copies every complete version of
the home (verified against its manifest, sealed first when it has none) and the bundles
they name, under the same version names; a model's promotion is copied only where the store
has none, so a second run changes nothing and never undoes a promotion made since.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from cloud_api.cli import fail, guarded, home_arg, settings_for
from cloud_api.home import ModelHome
from cloud_api.settings import Settings
from cloud_api.store.db import Database
from cloud_api.store.model_store import ModelStore
from cloud_api.store.stored_home import StoredHome, import_home
from models.cli.options import parsed


@dataclass(frozen=True)
class StoreOptions:
    """``cloud-api store import-home | sync``: the database and the home."""

    database_url: str | None
    home: str | None


@dataclass(frozen=True)
class StoreListOptions(StoreOptions):
    """``cloud-api store list``."""

    json: bool


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("store", help="the shared model store: import-home | list | sync",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ssub = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    imp = ssub.add_parser("import-home", help="copy $PRIVBERT_HOME's versions, bundles and "
                          "promotions into the store (idempotent)")
    imp.set_defaults(func=guarded(run_import, parsed(StoreOptions)))
    ls = ssub.add_parser("list", help="stored versions and promotions")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=guarded(run_list, parsed(StoreListOptions)))
    sy = ssub.add_parser("sync", help="fetch and check what the store promotes into the home")
    sy.set_defaults(func=guarded(run_sync, parsed(StoreOptions)))
    for q in (imp, ls, sy):
        q.add_argument("--database-url", metavar="URL", help="SQLAlchemy URL (default "
                       "$PRIVBERT_DATABASE_URL)")
        home_arg(q)


def _store(o: StoreOptions) -> tuple[Settings, ModelStore]:
    settings = settings_for(o.home)
    if o.database_url:
        settings = settings.model_copy(update={"database_url": o.database_url})
    db = Database.from_settings(settings)
    current, head = db.current(), db.head()
    if current != head:
        db.dispose()
        raise RuntimeError(f"database is at revision {current or 'none (empty)'}, this code "
                           f"needs {head}: run `cloud-api db upgrade`")
    return settings, ModelStore(db)


def run_import(o: StoreOptions) -> int:
    try:
        settings, store = _store(o)
    except RuntimeError as exc:
        return fail(str(exc))
    try:
        bad = import_home(ModelHome(settings.home), store)
    finally:
        store.db.dispose()
    return 1 if bad else 0


def run_list(o: StoreListOptions) -> int:
    try:
        _, store = _store(o)
    except RuntimeError as exc:
        return fail(str(exc))
    try:
        promos = store.promotions()
        out: list[dict[str, Any]] = [
            {"id": m, "promoted": promos[m].version if m in promos else None,
             "serial": promos[m].serial if m in promos else None,
             "versions": [{"version": v.version, "files": v.files, "bytes": v.bytes,
                           "manifest_sha256": v.manifest_sha256, "bundle_id": v.bundle_id}
                          for v in store.versions(m)]}
            for m in store.model_ids()]
    finally:
        store.db.dispose()
    if o.json:
        print(json.dumps({"models": out}, indent=2))
        return 0
    if not out:
        print("no models in the store (cloud-api store import-home, or bootstrap with "
              "PRIVBERT_MODEL_STORE=database)")
    for m in out:
        print(f"{m['id']}  promoted={m['promoted'] or '-'}")
        for v in m["versions"]:
            mark = "*" if v["version"] == m["promoted"] else " "
            print(f"  {mark} {v['version']}  {v['files']} files  {v['bytes']:,} bytes  "
                  f"manifest={v['manifest_sha256'][:12]}")
    return 0


def run_sync(o: StoreOptions) -> int:
    try:
        settings, store = _store(o)
    except RuntimeError as exc:
        return fail(str(exc))
    try:
        report = StoredHome(settings.home, store).ensure().sync()
    finally:
        store.db.dispose()
    for model_id, version in sorted(report.changed.items()):
        print(f"{model_id} {version}: fetched, checked, promoted here")
    for model_id, why in sorted(report.failed.items()):
        print(f"{model_id}: NOT used: {why}")
    return 1 if report.failed else 0
