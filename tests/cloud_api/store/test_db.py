"""The database layer on SQLite and PostgreSQL: migrations on an empty database (also
from several processes' worth of threads at once), `cloud-api db`, task declarations,
and outages that raise Unavailable and heal by themselves."""

from __future__ import annotations

import json
import sqlite3

import pytest
from sqlalchemy import inspect, select, text

from cloud_api.errors import Conflict, InvalidRequest, Unavailable
from cloud_api.store import records as store
from cloud_api.store import tasks
from cloud_api.store.db import Database
from cloud_api.store.tables import records as records_table
from shared.arrays import Limits
from shared.mechanisms import DChiText
from tests.cloud_api.store.conftest import ETA, privatize, race, raw_records


def test_migrations_on_an_empty_database(db_url):
    db = Database(db_url)
    try:
        assert db.current() is None and db.head() is not None
        assert db.upgrade() == db.head() == db.current()
        names = set(inspect(db.engine).get_table_names())
        assert {"tasks", "records", "idempotency", "alembic_version"} <= names
        idx = {i["name"] for i in inspect(db.engine).get_indexes("records")}
        assert {"ix_records_task_id_id", "ix_records_task_id_label", "ix_records_key_id"} <= idx
        uq = inspect(db.engine).get_unique_constraints("idempotency")
        assert [u["column_names"] for u in uq] == [["key_id", "idempotency_key"]]
        assert db.downgrade("base") is None  # every downgrade runs too
        assert not {"tasks", "records"} & set(inspect(db.engine).get_table_names())
        assert db.upgrade() == db.head()
    finally:
        db.dispose()


def upgrade_at_once(url: str, n: int = 4) -> None:
    """``n`` engines on ``url`` upgrading at once (like ``n`` processes starting): each
    reaches the head."""
    dbs = [Database(url, busy_timeout_s=30) for _ in range(n)]
    try:
        out = race([d.upgrade for d in dbs])
        head = dbs[0].head()
    finally:
        for d in dbs:
            d.dispose()
    assert out == [head] * n, (url, out)


def test_concurrent_upgrades_are_serialized(db_url):
    upgrade_at_once(db_url)


def test_many_processes_creating_one_sqlite_file(tmp_path):
    """Four engines opening a brand-new SQLite file at once: the switch to WAL needs an
    exclusive lock that SQLite refuses at once (no busy handler), which failed about one
    start in six (CI, stop 15) until the connect hook retried it. 20 fresh files: with
    the old hook at least one of them fails with probability above 0.97."""
    for n in range(20):
        upgrade_at_once(f"sqlite:///{tmp_path / f'new{n}.db'}")
        with sqlite3.connect(tmp_path / f"new{n}.db") as c:
            assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_cli_db_upgrade_and_current(tmp_path):
    from tests.cloud_api.conftest import cloud_api

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    r = cloud_api("db", "current", "--database-url", url, "--check")
    assert r.returncode == 1 and "revision none (empty)" in r.stdout
    r = cloud_api("db", "upgrade", "--database-url", url)
    assert r.returncode == 0 and "upgraded from empty to" in r.stdout, r.stderr
    db = Database(url)
    assert db.current() == db.head()
    db.dispose()


def test_the_sqlite_file_and_its_journal_are_the_owners_alone(tmp_path):
    """Records, budgets and key ids are nobody else's to read (issue 34: the database was
    0644): a new file is 0600 whatever the umask, and so are its -wal and -shm files; an
    older file readable by others is made private when the service opens it; `cloud-api db
    upgrade` makes it so too."""
    import os
    import stat

    from tests.cloud_api.conftest import cloud_api

    def modes(path) -> dict[str, int]:
        return {f.name: stat.S_IMODE(f.stat().st_mode) for f in sorted(path.parent.iterdir())
                if f.name.startswith(path.name)}

    new = tmp_path / "new" / "privbert.db"
    old_umask = os.umask(0)
    try:
        db = Database(f"sqlite:///{new}")
        db.upgrade()
        with db.begin(write=True) as conn:  # a write, with the connection kept: -wal, -shm
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
            conn.execute(text("INSERT INTO t VALUES (1)"))
        with db.engine.connect() as conn:
            conn.execute(text("SELECT x FROM t")).all()
            seen = modes(new)
        db.dispose()
    finally:
        os.umask(old_umask)
    assert seen == {"privbert.db": 0o600, "privbert.db-shm": 0o600, "privbert.db-wal": 0o600}
    older = tmp_path / "older.db"
    sqlite3.connect(older).close()
    older.chmod(0o644)
    Database(f"sqlite:///{older}").dispose()
    assert modes(older) == {"older.db": 0o600}
    cli = tmp_path / "cli" / "privbert.db"
    r = cloud_api("db", "upgrade", "--database-url", f"sqlite:///{cli}")
    assert r.returncode == 0, r.stderr
    assert modes(cli)["privbert.db"] == 0o600


def test_postgres_not_migrated_refuses_to_start_unless_auto_upgrade(fresh_postgres_url):
    db = Database(fresh_postgres_url)
    with pytest.raises(RuntimeError, match="cloud-api db upgrade"):
        db.prepare()  # PostgreSQL is not migrated by the server unless told to
    Database(fresh_postgres_url, auto_upgrade=True).prepare()
    db.prepare()  # at head now
    db.dispose()


def test_task_declarations_are_immutable(db, tiny_bundle):
    bid = tiny_bundle.bundle_id
    t, created = tasks.ensure_task(db, "lap", ["a", "b", "c"], "laplace", {"epsilon": 2},
                                   bid)
    assert created and t.params == {"epsilon": 2.0, "calibration": "vector",
                                    "word_dropout": 0.0}
    same, created = tasks.ensure_task(db, "lap", ["a", "b", "c"], "laplace",
                                      {"epsilon": 2.0, "calibration": "vector"}, bid)
    assert not created and same.id == t.id
    for change, msg in [({"labels": ["a", "b"]}, "labels"),
                        ({"params": {"epsilon": 2, "calibration": "coordinate"}},
                         "calibration coordinate sent, task has calibration vector"),
                        ({"mechanism": "ome", "params": {"epsilon": 1, "lam": 1}},
                         "mechanism ome sent"),
                        ({"bundle_id": "0" * 64}, "bundle 000000000000"),
                        ({"pairs": True}, "pairs true sent, task has false")]:
        args = {"name": "lap", "labels": ["a", "b", "c"], "mechanism": "laplace",
                "params": {"epsilon": 2}, "bundle_id": bid, **change}
        with pytest.raises(Conflict, match=msg):
            tasks.ensure_task(db, **args)
    with pytest.raises(InvalidRequest):
        tasks.ensure_task(db, "bad", ["a", "b"], "laplace", {"eps": 2}, bid)
    with pytest.raises(InvalidRequest):
        tasks.ensure_task(db, "bad", ["a", "a"], "dchi-text", {"eta": 1}, bid)
    with pytest.raises(InvalidRequest):
        tasks.ensure_task(db, "../x", ["a", "b"], "dchi-text", {"eta": 1}, bid)
    assert tasks.get_task(db, "lap").public() == {
        "task": "lap", "labels": ["a", "b", "c"], "mechanism": "laplace",
        "params": {"epsilon": 2.0, "calibration": "vector", "word_dropout": 0.0},
        "bundle_id": bid, "pairs": False}


def test_racing_declarations_create_one_task(db, tiny_bundle):
    n = 5
    out = race([lambda: tasks.ensure_task(db, "race", ["x", "y"], "dchi-text", {"eta": ETA},
                                          tiny_bundle.bundle_id)] * n, timeout=60)
    assert all(isinstance(o, tuple) for o in out), out
    assert sorted(c for _, c in out) == [False] * (n - 1) + [True]
    assert len({t.id for t, _ in out}) == 1


def test_sql_errors_never_show_payload_bytes_or_keys(db):
    """An error's message ends up in logs (the 500 handler, the worker): SQLAlchemy must not
    render the statement's parameters into it (a foreign key violation: neither database
    echoes the row's values itself)."""
    from datetime import UTC, datetime

    from sqlalchemy import insert
    from sqlalchemy.exc import IntegrityError

    row = dict(task_id=10**6, label="neg", mechanism="dchi-text", params={}, bundle_id="b",
               dtype="int32", shape=[3], payload=b"qzxvorpal-payload", key_id="qzxvorpal-key",
               created_at=datetime.now(UTC))
    with pytest.raises(IntegrityError) as err, db.begin(write=True) as conn:
        conn.execute(insert(records_table).values(**row))
    assert "qzxvorpal" not in str(err.value) and b"qzxvorpal".hex() not in str(err.value)
    assert "parameters hidden" in str(err.value)


def test_list_tasks_counts_per_label(db, task, tiny_bundle):
    raw = raw_records(privatize(tiny_bundle, DChiText(tiny_bundle, ETA), 5), [1, 1, 0, 1, 1])
    recs = store.validate_records(task, raw, Limits.for_bundle(tiny_bundle,
                                                               labels=task.labels))
    store.add_records(db, task, recs, "k1")
    tasks.ensure_task(db, "empty", ["u", "v"], "dchi-text", {"eta": ETA},
                      tiny_bundle.bundle_id)
    got = {t["task"]: t for t in tasks.list_tasks(db)}
    assert got["sst2"]["counts"] == {"neg": 1, "pos": 4} and got["sst2"]["records"] == 5
    assert got["empty"]["counts"] == {"u": 0, "v": 0} and got["empty"]["soft"] == 0


def test_sqlite_locked_past_busy_timeout_is_unavailable_then_heals(tmp_path, tiny_bundle):
    path = tmp_path / "locked.db"
    db = Database(f"sqlite:///{path}", busy_timeout_s=0.2)
    db.upgrade()
    t = tasks.ensure_task(db, "s", ["neg", "pos"], "dchi-text", {"eta": ETA},
                          tiny_bundle.bundle_id)[0]
    recs = store.validate_records(t, raw_records(privatize(
        tiny_bundle, DChiText(tiny_bundle, ETA), 3)), Limits.for_bundle(tiny_bundle))
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(Unavailable) as err:
            store.add_records(db, t, recs, "k1", "i-1", "d" * 64)
        assert err.value.status == 503 and err.value.retry_after
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert len(store.add_records(db, t, recs, "k1", "i-1", "d" * 64).ids) == 3
    db.dispose()


def test_driver_outage_errors_outside_sqlalchemy_are_unavailable(db, task, tiny_bundle,
                                                                 monkeypatch):
    """PostgreSQL's COPY goes through psycopg directly (store/bulk.py): a connection lost
    there raises the driver's own error, which must be a 503 too, not a 500."""
    from cloud_api.store import bulk

    recs = store.validate_records(task, raw_records(privatize(
        tiny_bundle, DChiText(tiny_bundle, ETA), 3)), Limits.for_bundle(tiny_bundle))
    lost = db.engine.dialect.loaded_dbapi.OperationalError("server closed the connection")

    def write_rows(conn, rows):
        raise lost

    monkeypatch.setattr(bulk, "write_rows", write_rows)
    with pytest.raises(Unavailable):
        store.add_records(db, task, recs, "k1")
    monkeypatch.undo()
    assert len(store.add_records(db, task, recs, "k1").ids) == 3  # nothing half-written


def test_postgres_outage_is_unavailable_then_heals(pg_cluster, fresh_postgres_url,
                                                   tiny_bundle):
    db = Database(fresh_postgres_url, connect_timeout_s=1)
    db.upgrade()
    t = tasks.ensure_task(db, "p", ["neg", "pos"], "dchi-text", {"eta": ETA},
                          tiny_bundle.bundle_id)[0]
    recs = store.validate_records(t, raw_records(privatize(
        tiny_bundle, DChiText(tiny_bundle, ETA), 3)), Limits.for_bundle(tiny_bundle))
    store.add_records(db, t, recs, "k1")  # pooled connections exist now
    pg_cluster.stop()
    try:
        for call in (db.ping, lambda: tasks.get_task(db, "p"),
                     lambda: store.add_records(db, t, recs, "k1"),
                     lambda: store.delete_records(db, key_id="k1")):
            with pytest.raises(Unavailable):
                call()
    finally:
        pg_cluster.start()
    db.ping()  # the same Database: broken connections were dropped, new ones work
    store.add_records(db, t, recs, "k1")
    with db.begin() as conn:
        assert len(conn.execute(select(records_table.c.id)).all()) == 6
    db.dispose()


def test_the_charge_writer_survives_a_postgres_restart(pg_cluster, fresh_postgres_url):
    """The prediction charge writer keeps one connection between groups; after the server
    restarts, that connection is dead: the next group is applied on a new one (nothing of
    the failed attempt was committed), not answered 503, and charged once."""
    import asyncio

    from cloud_api.store import budget_admin, budgets
    from cloud_api.store.charge_writer import ChargeWriter
    from shared import ledger

    db = Database(fresh_postgres_url, connect_timeout_s=1)
    db.upgrade()
    writer = ChargeWriter(db)
    cost = ledger.cost("laplace", {"epsilon": 1.0}, dim=4)

    async def charge() -> budgets.Charged:
        return await writer.charge(budgets.Charge("k", "", cost))

    try:
        assert asyncio.run(charge()).spent == 1.0
        pg_cluster.stop()
        pg_cluster.start()
        assert asyncio.run(charge()).spent == 2.0
        assert budget_admin.get_budget(db, "k", set(), None)["sends"] == 2
    finally:
        writer.close()
        db.dispose()


def test_logs_drop_the_rows_postgresql_puts_in_its_error_details(fresh_postgres_url, capsys):
    """PostgreSQL's NOT NULL error carries "DETAIL: Failing row contains (...)" with every
    column, bytes as hex; a unique violation "Key (...)=(...)". The service's formatters
    (JSON and plain) log the error and its traceback without those lines."""
    import io
    import logging

    from sqlalchemy import exc as sa_exc

    from cloud_api.logs import json_formatter, plain_formatter

    marker = b"qzxvorpal payload bytes"
    db = Database(fresh_postgres_url)
    try:
        with db.engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (k text UNIQUE, label text NOT NULL, p bytea)"))
            conn.execute(text("INSERT INTO t VALUES ('idem-secret', 'a', NULL)"))
        caught = []
        for stmt, k in (("INSERT INTO t VALUES (:k, NULL, :p)", "x"),
                        ("INSERT INTO t VALUES (:k, 'b', :p)", "idem-secret")):
            with pytest.raises(sa_exc.IntegrityError) as info, db.engine.begin() as conn:
                conn.execute(text(stmt), {"k": k, "p": marker})
            caught.append(info.value)
        assert marker.hex() in str(caught[0]) and "idem-secret" in str(caught[1])  # raw
        for formatter in (json_formatter(), plain_formatter()):
            out = io.StringIO()
            handler = logging.StreamHandler(out)
            handler.setFormatter(formatter)
            log = logging.getLogger(f"test.scrub.{id(formatter)}")
            log.addHandler(handler)
            log.propagate = False
            for exc in caught:
                try:
                    raise exc
                except sa_exc.IntegrityError as e:
                    log.exception("unhandled error")
                    log.warning("database said: %s", e)
            written = out.getvalue()
            assert "NotNullViolation" in written and "UniqueViolation" in written
            assert marker.hex() not in written and "idem-secret" not in written, written
            assert "Failing row" not in written
    finally:
        db.dispose()


def test_upgrade_to_0003_reserves_the_names_of_live_pretraining_jobs(db_url):
    """Jobs queued before migration 0003 hold their base name after it: the oldest live
    job of a name (two could share one before), none for finished jobs; and a new
    submission of a held name is then refused (409)."""
    from datetime import UTC, datetime

    from cloud_api.jobs import queue
    from cloud_api.jobs.table import jobs as jobs_table

    db = Database(db_url)
    try:
        db.upgrade("0002_jobs")
        old = [("queued", "a"), ("running", "a"), ("queued", "b"), ("failed", "c")]
        with db.begin(write=True) as conn:
            for state, name in old:
                conn.execute(text(
                    "INSERT INTO jobs (kind, spec, state, attempts, max_attempts, created_at, "
                    "cancel_requested) VALUES ('pretrain', :spec, :state, 0, 2, :now, :no)"),
                    {"spec": json.dumps({"name": name}), "state": state,
                     "now": datetime.now(UTC), "no": False})
        assert db.upgrade() == db.head()
        with db.begin() as conn:
            got = conn.execute(select(jobs_table.c.id, jobs_table.c.reserved)
                               .order_by(jobs_table.c.id)).all()
        assert [r.reserved for r in got] == ["a", None, "b", None]
        with pytest.raises(Conflict, match=f"job {got[0].id} \\(queued\\)"):
            queue.enqueue(db, "pretrain", {"name": "a"}, reserve="a")
        queue.enqueue(db, "pretrain", {"name": "c"}, reserve="c")  # c's job had ended
    finally:
        db.dispose()


def test_upgrade_to_0005_folds_devices_into_their_key_and_keeps_records(db_url, tiny_bundle):
    """A database of migration 0004 (each device spending apart under a copy of the key's
    cap, a task with a stored pair record) after the upgrade: the key's ledger counts every
    device (so a key already past its cap is refused), device caps are their own (none),
    nothing stored is lost, and the pair task is marked so; and it downgrades back."""
    from datetime import UTC, datetime

    from cloud_api.store import budget_admin, budgets
    from shared import ledger

    db = Database(db_url)
    try:
        db.upgrade("0004_budgets")
        now = datetime.now(UTC)
        zeros = {c: 0 for c in ("dchi_epsilon", "dchi_metric", "dchi_tokens", "dchi_sends",
                                "rr_epsilon", "rr_sends", "texthide_sends", "none_sends")}
        row = {"key_id": "k", "cap": 10.0, "sends": 2, "laplace_sends": 2, "updated_at": now,
               **zeros}
        with db.begin(write=True) as conn:  # the table of 0004 (its columns, not today's)
            for dev, spent in (("", 1.0), ("d1", 8.0), ("d2", 7.0)):
                values = {**row, "device_id": dev, "spent": spent, "laplace_epsilon": spent}
                conn.execute(text(f"INSERT INTO budgets ({', '.join(values)}) VALUES "
                                  f"({', '.join(':' + c for c in values)})"), values)
            for name, segs in (("single", None), ("pair", "[2, 3]")):
                tid = conn.execute(text(
                    "INSERT INTO tasks (name, labels, mechanism, params, bundle_id, "
                    "created_at) VALUES (:n, '[\"a\", \"b\"]', 'dchi-text', '{\"eta\": 10.0}',"
                    " :b, :now) RETURNING id"), {"n": name, "b": tiny_bundle.bundle_id,
                                                 "now": now}).scalar_one()
                conn.execute(text(
                    "INSERT INTO records (task_id, label, mechanism, params, bundle_id, dtype,"
                    " shape, segments, payload, key_id, created_at) VALUES (:t, 'a', "
                    "'dchi-text', '{\"eta\": 10.0}', :b, 'int32', '[5]', :s, :p, 'k', :now)"),
                    {"t": tid, "b": tiny_bundle.bundle_id, "s": segs, "p": b"\0" * 20,
                     "now": now})
        assert db.upgrade() == db.head()
        view = budget_admin.get_budget(db, "k", set(), None)
        assert (view["spent"], view["sends"], view["cap"]) == (16.0, 6, 10.0)
        assert view["families"]["laplace"] == {"epsilon": 16.0, "sends": 6}
        assert [(d["spent"], d["cap"]) for d in view["devices"]] == [(8.0, None), (7.0, None)]
        with pytest.raises(budgets.BudgetExhausted), db.begin(write=True) as conn:
            budgets.charge(conn, budgets.Charge("k", "d3", ledger.cost(
                "laplace", {"epsilon": 0.1}, dim=4)))
        from cloud_api.store.tasks import get_task
        assert (get_task(db, "single").pairs, get_task(db, "pair").pairs) == (False, True)
        with db.begin() as conn:
            assert conn.execute(text("SELECT count(*) FROM records")).scalar_one() == 2
        db.downgrade("0004_budgets")
        with db.begin() as conn:
            rows = conn.execute(text("SELECT device_id, spent, cap FROM budgets "
                                     "ORDER BY device_id")).all()
        assert [tuple(r) for r in rows] == [("", 1.0, 10.0), ("d1", 8.0, 10.0),
                                            ("d2", 7.0, 10.0)]
    finally:
        db.dispose()


def test_a_full_sqlite_database_is_insufficient_storage_not_an_outage(tmp_path, tiny_bundle):
    """SQLite past its size limit (``max_page_count``, what a full disk looks like to it):
    507 insufficient-storage, nothing stored, and the database still answers."""
    from sqlalchemy import event

    from cloud_api.errors import InsufficientStorage
    from cloud_api.store import records as store
    from cloud_api.store import tasks
    from cloud_api.store.snapshot import label_counts
    from shared.arrays import Limits
    from shared.mechanisms import DChiText
    from tests.cloud_api.store.conftest import ETA, privatize, raw_records

    db = Database(f"sqlite:///{tmp_path / 'full.db'}")
    try:
        db.upgrade()
        task, _ = tasks.ensure_task(db, "t", ["neg", "pos"], "dchi-text", {"eta": ETA},
                                    tiny_bundle.bundle_id)
        with db.begin() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        db.dispose()

        @event.listens_for(db.engine, "connect")
        def _limit(dbapi_conn, _record) -> None:
            dbapi_conn.execute(f"PRAGMA max_page_count = {pages + 2}")

        recs = store.validate_records(task, raw_records(privatize(
            tiny_bundle, DChiText(tiny_bundle, ETA), 400)),
            Limits.for_bundle(tiny_bundle, labels=task.labels))
        with pytest.raises(InsufficientStorage) as exc:
            store.add_records(db, task, recs, "k")
        assert exc.value.status == 507 and exc.value.kind == "insufficient-storage"
        assert label_counts(db, "t") == {"neg": 0, "pos": 0}
    finally:
        db.dispose()
