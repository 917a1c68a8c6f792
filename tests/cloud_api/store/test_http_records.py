"""Tasks and records through a real `cloud-api serve`, on SQLite and on a real PostgreSQL:
declarations, validation before write, idempotency (also racing), erasure, the real
edge CLI uploading records, a tripwire on the stored bytes, and a database outage that
answers 503 and recovers (predictions too: each is charged to its key's ledger)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cloud_api.auth import key_id
from cloud_api.errors import problem_type
from shared.mechanisms import DChiEmbedding, DChiText
from tests.cloud_api.conftest import (
    ETA,
    ServerProcess,
    body_of,
    cli_env,
    cloud_api,
    new_keys,
    payloads_for,
)
from tests.conftest import REPO

PROBLEM = "application/problem+json"
MARKERS = ["secret", "marker", "qzxvorpal"]  # the last one is no word of the tiny vocabulary


class StoreServer(ServerProcess):
    kind: str = "sqlite"
    db_path: Path | None = None
    pg = None
    dbname: str = ""


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def srv(request, tiny_home, tmp_path_factory):
    """A server on the tiny home with its own, empty database (SQLite: migrated at start;
    PostgreSQL: migrated beforehand by `cloud-api db upgrade`)."""
    tmp = tmp_path_factory.mktemp(f"records-{request.param}")
    env = {"PRIVBERT_RATE_LIMIT_PER_KEY": "0", "PRIVBERT_DB_BUSY_TIMEOUT_S": "0.5",
           "PRIVBERT_DB_CONNECT_TIMEOUT_S": "1", "PRIVBERT_WORKER_IN_SERVE": "0",
           "PRIVBERT_MAX_PAYLOADS_PER_REQUEST": "300"}
    pg = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'records.db'}"
    else:
        pg = request.getfixturevalue("pg_cluster")
        url = pg.create_database("http_records")
        up = cloud_api("db", "upgrade", "--database-url", url)
        assert up.returncode == 0 and "upgraded from empty to" in up.stdout, up.stderr
    env["PRIVBERT_DATABASE_URL"] = url
    s = StoreServer(tiny_home.root, tmp / "serve.log", new_keys(app=2), env)
    s.kind, s.pg, s.dbname = request.param, pg, "http_records"
    s.db_path = tmp / "records.db" if request.param == "sqlite" else None
    s.start()
    yield s
    s.stop()


def call(srv, method: str, path: str, key: str | None = None, **kw) -> httpx.Response:
    headers = {**srv.headers(key), **kw.pop("headers", {})}
    return httpx.request(method, f"{srv.url}{path}", headers=headers, timeout=30, **kw)


def assert_problem(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["type"] == problem_type(kind), body
    return body


def declare(srv, bundle, mechanism="dchi-text", eta=ETA, name=None) -> str:
    name = name or f"t-{uuid.uuid4().hex[:8]}"
    r = call(srv, "POST", "/admin/tasks", srv.admin_key, json={
        "task": name, "labels": ["neg", "pos"], "mechanism": mechanism, "params": {"eta": eta},
        "bundle_id": bundle.bundle_id})
    assert r.status_code == 201, r.text
    return name


def records_body(task: str, payloads, labels=None) -> str:
    labels = labels if labels is not None else [["neg", "pos"][i % 2]
                                                for i in range(len(payloads))]
    recs = ",".join('{"payload":' + p.model_dump_json(exclude_none=True) + ',"label":'
                    + json.dumps(lab) + "}" for p, lab in zip(payloads, labels, strict=True))
    return '{"task":' + json.dumps(task) + ',"records":[' + recs + "]}"


def post_records(srv, body: str, key=None, idem=None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if idem:
        headers["Idempotency-Key"] = idem
    return call(srv, "POST", "/v1/records", key, content=body, headers=headers)


def counts(srv, task: str) -> dict:
    r = call(srv, "GET", "/admin/tasks", srv.admin_key)
    assert r.status_code == 200, r.text
    return next(t for t in r.json()["tasks"] if t["task"] == task)["counts"]


def text_payloads(bundle, n: int, eta=ETA):
    from edge_agent import Privatizer

    texts = ["the movie is good", "a bad plot", "fun story", "dull actor"]
    return Privatizer(bundle, DChiText(bundle, eta)).privatize(
        [texts[i % 4] for i in range(n)])


def test_task_declarations(srv, tiny_bundle_of_home):
    b = tiny_bundle_of_home
    name = declare(srv, b)
    decl = {"task": name, "labels": ["neg", "pos"], "mechanism": "dchi-text",
            "params": {"eta": float(ETA)}, "bundle_id": b.bundle_id}
    r = call(srv, "POST", "/admin/tasks", srv.admin_key, json=decl)
    assert r.status_code == 200 and r.json() == {**decl, "pairs": False}  # idempotent
    body = assert_problem(call(srv, "POST", "/admin/tasks", srv.admin_key,
                               json={**decl, "params": {"eta": 7}}), 409, "conflict")
    assert "eta 7 sent, task has eta 5" in body["detail"]
    assert_problem(call(srv, "POST", "/admin/tasks", srv.admin_key,
                        json={**decl, "task": "x2", "bundle_id": "c" * 64}), 422, "validation")
    assert_problem(call(srv, "POST", "/admin/tasks", srv.admin_key,
                        json={**decl, "task": "x3", "params": {"eta": -1}}), 422, "validation")
    assert_problem(call(srv, "POST", "/admin/tasks", json=decl), 403, "forbidden")
    assert call(srv, "GET", f"/v1/tasks/{name}").json() == {**decl, "pairs": False}
    assert_problem(call(srv, "GET", "/v1/tasks/nope"), 404, "not-found")
    assert counts(srv, name) == {"neg": 0, "pos": 0}


def test_records_stored_whole_or_not_at_all(srv, tiny_bundle_of_home):
    b = tiny_bundle_of_home
    name = declare(srv, b)
    good = text_payloads(b, 6)
    r = post_records(srv, records_body(name, good, ["neg", "pos", 0, 1, "pos", "pos"]))
    assert r.status_code == 201, r.text
    ids = r.json()["ids"]
    assert len(ids) == 6 and ids == sorted(ids)
    assert counts(srv, name) == {"neg": 2, "pos": 4}
    # one record made with another eta: 422 naming it, nothing of the request stored
    bad = good[:3] + text_payloads(b, 1, eta=4.0) + good[3:]
    body = assert_problem(post_records(srv, records_body(name, bad)), 422, "payload-mismatch")
    assert body["detail"].startswith("record 3: eta 4 sent, task accepts eta 5")
    body = assert_problem(post_records(srv, records_body(name, good, ["neg"] * 5 + ["meh"])),
                          422, "validation")
    assert body["detail"].startswith("record 5: ")
    assert counts(srv, name) == {"neg": 2, "pos": 4}
    assert_problem(post_records(srv, records_body("no-such-task", good)), 404, "not-found")
    assert_problem(post_records(srv, records_body(name, good * 51)), 413,
                   "too-many-payloads")  # 306 > 300
    assert_problem(post_records(srv, '{"task": "x", "records": [}'), 422, "validation")
    assert counts(srv, name) == {"neg": 2, "pos": 4}


def test_idempotency_key(srv, tiny_bundle_of_home):
    b = tiny_bundle_of_home
    name = declare(srv, b)
    body = records_body(name, text_payloads(b, 5))
    first = post_records(srv, body, idem="batch-1")
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers
    again = post_records(srv, json.dumps(json.loads(body), indent=1), idem="batch-1")
    assert again.status_code == 201 and again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert sum(counts(srv, name).values()) == 5
    other = records_body(name, text_payloads(b, 5))
    problem = assert_problem(post_records(srv, other, idem="batch-1"), 422,
                             "idempotency-key-reused")
    assert "different body" in problem["detail"]
    # racing retries of one request: all get the same ids, the rows are stored once
    body = records_body(name, text_payloads(b, 40))
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: post_records(srv, body, idem="race-1"), range(6)))
    assert {r.status_code for r in answers} == {201}, [r.text for r in answers]
    assert len({tuple(r.json()["ids"]) for r in answers}) == 1
    assert sum(counts(srv, name).values()) == 45


def test_erasure_by_key_id_and_delete(srv, tiny_bundle_of_home):
    b = tiny_bundle_of_home
    name = declare(srv, b)
    alice, bob = srv.keys["app"]  # bob sends records only here
    a = post_records(srv, records_body(name, text_payloads(b, 4)), key=alice).json()["ids"]
    bo = post_records(srv, records_body(name, text_payloads(b, 3)), key=bob).json()["ids"]
    assert_problem(call(srv, "DELETE", "/admin/records", bob,
                        params={"key_id": key_id(bob)}), 403, "forbidden")
    r = call(srv, "DELETE", "/admin/records", srv.admin_key, params={"key_id": key_id(bob)})
    assert r.status_code == 200 and r.json() == {"deleted": 3}
    assert sum(counts(srv, name).values()) == 4
    r = call(srv, "DELETE", "/admin/records", srv.admin_key,
             content=json.dumps({"ids": [bo[0], a[0]], "task": name}))
    assert r.json() == {"deleted": 1}
    r = call(srv, "DELETE", "/admin/records", srv.admin_key, params={"task": name})
    assert r.json() == {"deleted": 3} and sum(counts(srv, name).values()) == 0
    assert_problem(call(srv, "DELETE", "/admin/records", srv.admin_key), 422, "validation")
    assert_problem(call(srv, "DELETE", "/admin/records", srv.admin_key,
                        params={"task": "nope"}), 404, "not-found")


def test_replay_after_erasure_stores_afresh(srv, tiny_bundle_of_home):
    """An erasure by ids, or by key id with a task, leaves no idempotency answer naming
    deleted records: the same key and body afterwards store anew, never a 201 with the
    erased ids."""
    b = tiny_bundle_of_home
    name = declare(srv, b)
    alice = srv.keys["app"][0]
    body = records_body(name, text_payloads(b, 4))
    first = post_records(srv, body, key=alice, idem="erase-1").json()["ids"]
    for sel in ({"ids": first[1:2]}, {"key_id": key_id(alice), "task": name}):
        r = call(srv, "DELETE", "/admin/records", srv.admin_key, content=json.dumps(sel))
        assert r.status_code == 200 and r.json()["deleted"] >= 1, r.text
        again = post_records(srv, body, key=alice, idem="erase-1")
        assert again.status_code == 201 and "idempotent-replayed" not in again.headers
        assert set(again.json()["ids"]).isdisjoint(first), (sel, again.json(), first)
        first = again.json()["ids"]
    assert sum(counts(srv, name).values()) == 4  # the last request, once
    replay = post_records(srv, body, key=alice, idem="erase-1")
    assert replay.headers["idempotent-replayed"] == "true" and replay.json()["ids"] == first


def test_edge_cli_uploads_records(srv, tiny_bundle_of_home, tiny_home):
    """The real edge CLI uploads a TSV twice: the second time every text is memoized on the
    device (charged nothing there), and the server receives and stores the same payloads,
    byte for byte."""
    from cloud_api.store.db import Database
    from cloud_api.store.snapshot import snapshot

    name = declare(srv, tiny_bundle_of_home)
    n_rows = len(tiny_home.data.read_text().splitlines()) - 1  # header
    for run in (1, 2):
        out = tiny_home.root.parent / f"uploaded-{srv.kind}-{run}.jsonl"
        res = subprocess.run(
            [sys.executable, "-m", "edge_agent", "privatize", str(tiny_home.data), "--tsv",
             "--mechanism", "dchi-text", "--eta", str(ETA), "--server", srv.url, "--model",
             "text", "--post", "records", "--task", name, "--post-batch", "16", "-o",
             str(out), "--no-progress"],
            cwd=REPO, env=cli_env({"PRIVBERT_API_KEY": srv.app_key}), capture_output=True,
            text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        assert len(lines) == n_rows and len({x["id"] for x in lines}) == n_rows
    assert "ledger: charged nothing" in res.stderr.splitlines()[-1]
    c = counts(srv, name)
    assert sum(c.values()) == 2 * n_rows and c["neg"] > 0 and c["pos"] > 0
    url = f"sqlite:///{srv.db_path}" if srv.kind == "sqlite" else srv.pg.url(srv.dbname)
    db = Database(url)
    try:
        rows = [r.payload.model_dump_json() for _, r in snapshot(db, name)[1]]
    finally:
        db.dispose()
    assert rows[:n_rows] == rows[n_rows:]  # the memoized payloads, as first sent


def stored_bytes(srv) -> bytes:
    """Everything the database holds: the SQLite file and its WAL, or a pg_dump."""
    if srv.kind == "sqlite":
        return b"".join(p.read_bytes() for p in srv.db_path.parent.glob("records.db*"))
    return srv.pg.dump(srv.dbname).encode()


def _home_bytes(root) -> bytes:
    return b"".join(f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file())


def test_tripwire_no_marker_word_in_the_database(srv, tiny_bundle_of_home, tiny_home):
    """Marker words of dchi-embedding records: nowhere in the database, the server's
    $PRIVBERT_HOME or its log."""
    from base64 import b64decode

    from edge_agent import Privatizer

    b = tiny_bundle_of_home
    name = declare(srv, b, mechanism="dchi-embedding")
    texts = [f"the {MARKERS[0]} {MARKERS[1]} was good", f"{MARKERS[2]} is a bad film"] * 4
    payloads = Privatizer(b, DChiEmbedding(ETA)).privatize(texts)
    home_before = _home_bytes(tiny_home.root)
    r = post_records(srv, records_body(name, payloads), idem="trip-1")
    assert r.status_code == 201, r.text
    data = stored_bytes(srv)
    raw = b64decode(payloads[0].embeddings.data)
    # the payload is stored as bytes (hex in a dump), never as its base64 text
    assert (raw in data) if srv.kind == "sqlite" else (raw.hex().encode() in data)
    assert payloads[0].embeddings.data.encode() not in data
    for word in MARKERS:
        assert word.encode() not in data, word
    log = srv.log.read_bytes()
    home = _home_bytes(tiny_home.root)
    for word in MARKERS:
        assert word.encode() not in log
        # "secret" and "marker" are words of the tiny vocabulary (the bundle holds them):
        # the home may hold a marker only as often as before the upload
        assert home.count(word.encode()) == home_before.count(word.encode()), word
    assert MARKERS[2].encode() not in home
    assert srv.app_key.encode() not in data + log + home


def test_database_outage_is_503_and_recovers(srv, tiny_bundle_of_home):
    b = tiny_bundle_of_home
    name = declare(srv, b)
    body = records_body(name, text_payloads(b, 4))
    predict = body_of(payloads_for(srv.model("text"), ["a good film"], b))
    lock = None
    if srv.kind == "sqlite":  # another process holds the write lock past the busy timeout
        lock = sqlite3.connect(srv.db_path, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
    else:
        srv.pg.stop()
    try:
        problem = assert_problem(post_records(srv, body, idem="outage-1"), 503, "unavailable")
        assert "database" in problem["detail"] and int(
            post_records(srv, body).headers["retry-after"]) >= 1
        if srv.kind == "postgresql":
            assert_problem(call(srv, "GET", "/admin/tasks", srv.admin_key), 503, "unavailable")
            assert_problem(call(srv, "GET", f"/v1/tasks/{name}"), 503, "unavailable")
        # a prediction is charged to the key's privacy budget ledger before the model runs:
        # without the database it is refused, never answered uncounted
        r = call(srv, "POST", "/v1/models/text/predict", content=predict,
                 headers={"Content-Type": "application/json"})
        assert_problem(r, 503, "unavailable")
        assert httpx.get(f"{srv.url}/healthz").status_code == 200
    finally:
        if lock is not None:
            lock.execute("ROLLBACK")
            lock.close()
        else:
            srv.pg.start()
    r = post_records(srv, body, idem="outage-1")  # the same request, now stored once
    assert r.status_code == 201, r.text
    r = call(srv, "POST", "/v1/models/text/predict", content=predict,
             headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert "idempotent-replayed" not in r.headers and sum(counts(srv, name).values()) == 4
    assert srv.proc.poll() is None
    assert "Traceback" not in srv.log.read_text()
