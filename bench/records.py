"""Record ingestion: records/s through the real HTTP server into SQLite and PostgreSQL.

SST-2 training sentences are privatized once with the edge's ``Privatizer``
(``dchi-text``, η = 65, the default MiniLM bundle) into batches of 256 labelled records;
the same request bodies are then posted again and again. For each database, in the same
run:

* baseline: the store's own insert called directly in this process
  (``store.records.add_records`` on records already validated), the same insert with the
  privacy budget charge in its transaction (``charge=``), and the whole non-HTTP path
  (envelope parse + validation against the task + cost + charge + insert);
* the check-and-charge alone (target <= 0.3 ms a request, so that the privacy budget ledger
  adds little to a records request): the cost of a request's 256
  payloads (``cloud_api.charging.records_cost``) and the conditional UPDATE of
  ``store.budgets.charge`` timed inside an open write transaction after its first
  statement, on the key's ledger alone and, in turn in the same transactions, on the key's
  and a device's together (target <= 1.2x one ledger: a key's cap that holds across devices
  should cost little more than one ledger) (what it adds to the records transaction, where it
  never comes first: the first statement also carries psycopg's BEGIN), next to a ``SELECT 1`` in the same
  transaction (one statement's round trip through SQLAlchemy and the driver, no work: the
  floor of any UPDATE), and
  prediction charges through the group-commit writer
  (``store.charge_writer``) with 32 requests at once, each answered after its commit;
* ``cloud-api serve`` as a subprocess on a loopback port with ``PRIVBERT_DATABASE_URL``
  pointing at a fresh database: ``POST /v1/records`` (auth, body limit, envelope, every
  record checked against its task, the sender's ledger charged, one transaction per
  request), closed loop with 1 and with 4 concurrent clients, each sending its next
  request when the last is answered (the key has a cap, PRIVBERT_DEFAULT_BUDGET, so every
  answer carries X-Privacy-Budget-Remaining).

Columns: records/s (wall clock), and records per CPU second of the process that does the
work (this one for the direct paths, the server for HTTP; the PostgreSQL server's own
processes are not counted in either): on these shared 2 cores the wall-clock figures move
with the other jobs' load, the CPU figure says what one free core would sustain.

SQLite: WAL with ``synchronous = FULL`` (what the server uses). PostgreSQL 15: a throwaway
cluster (``tests/pg.py``) with its durable defaults (fsync on, synchronous_commit on), or
``--postgres-url``. Targets: >= 2,000 records/s into each through HTTP, with the privacy budget ledger
charged (an edge uploading a day's labelled records should not wait on the server);
check-and-charge <= 0.3 ms a request.

    python -m bench.records                      # about 2 minutes
    python -m bench.records --requests 20 --databases sqlite
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import (
    DATA,
    REPO,
    cpu_seconds,
    free_port,
    machine,
    read_tsv,
    start_server,
    stop_server,
    table,
)

BATCH = 256
ETA = 65.0
LABELS = ["negative", "positive"]
HEADERS = ["database", "path", "records/s", "records per CPU s", "vs direct insert"]


def privatized_batches(n_batches: int) -> tuple[object, list[list[dict]]]:
    """(bundle, batches of raw records) from the first SST-2 training rows."""
    from edge_agent import Privatizer
    from shared.bundle import EdgeBundle
    from shared.mechanisms import DChiText

    rows = read_tsv(DATA / "sst2" / "train.tsv", limit=n_batches * BATCH)
    bundle = EdgeBundle.from_model()
    priv = Privatizer(bundle, DChiText(bundle, ETA))
    payloads = priv.privatize([r[0] for r in rows])
    recs = [{"payload": p.model_dump(mode="json", exclude_none=True), "label": int(r[1])}
            for p, r in zip(payloads, rows, strict=True)]
    return bundle, [recs[i:i + BATCH] for i in range(0, len(recs), BATCH)]


def body_of(task: str, batch: list[dict]) -> bytes:
    import orjson

    return orjson.dumps({"task": task, "records": batch})


# -- baseline: the store called directly --------------------------------------------------
def direct(url: str, bundle, bodies: list[bytes], requests: int
           ) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """({path: (records/s, records per CPU second of this process)}, {what: ms a request})."""
    from cloud_api import charging
    from cloud_api.store import budgets, tasks
    from cloud_api.store import records as store
    from cloud_api.store.db import Database
    from shared.arrays import Limits

    db = Database(url)
    db.upgrade()
    task, _ = tasks.ensure_task(db, "direct", LABELS, "dchi-text", {"eta": ETA},
                                bundle.bundle_id)
    limits = Limits.for_bundle(bundle, labels=task.labels)
    mine = [b.replace(b'"task":"bench"', b'"task":"direct"', 1) for b in bodies]
    valid = [store.validate_records(task, store.parse_body(b).records, limits) for b in mine]
    costs = [charging.records_cost(task, v, bundle) for v in valid]
    big = 1e300  # a cap nothing reaches: every charge checks it and goes through
    out = {}

    def timed(name: str, call) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(requests):
            call(i)
        n = requests * BATCH
        out[name] = (n / (time.perf_counter() - t0), n / (time.process_time() - c0))

    timed("insert", lambda i: store.add_records(db, task, valid[i % len(valid)], "bench"))
    timed("insert + charge", lambda i: store.add_records(
        db, task, valid[i % len(valid)], "bench",
        charge=budgets.Charge("bench", "", costs[i % len(costs)], big)))

    def whole(i: int) -> None:
        env = store.parse_body(mine[i % len(mine)])
        recs = store.validate_records(task, env.records, limits)
        ch = budgets.Charge("bench", "", charging.records_cost(task, recs, bundle), big)
        store.add_records(db, task, recs, "bench", f"direct-{i}", store.body_digest(env),
                          charge=ch)

    timed("parse+validate+cost+charge+insert", whole)
    ms = check_and_charge(db, task, valid, bundle, requests)
    db.dispose()
    return out, ms


def check_and_charge(db, task, valid: list, bundle, requests: int) -> dict[str, float]:
    """Milliseconds a request: the cost of its payloads, the check-and-charge UPDATE inside
    an open write transaction (both median over ``requests``), and a prediction charge
    through the group-commit writer with 32 at once (mean wall time from submit to commit,
    and wall time per charge)."""
    import asyncio
    import statistics

    from sqlalchemy import text

    from cloud_api import charging
    from cloud_api.store import budgets
    from cloud_api.store.charge_writer import ChargeWriter

    cost_ms, update_ms, floor_ms, first_ms, both_ms = [], [], [], [], []
    cpu = 0.0
    warm = charging.records_cost(task, valid[0][:1], bundle)
    with db.begin(write=True) as conn:  # the ledgers exist (their first charge creates them)
        for device in ["", *(f"d{i}" for i in range(8))]:
            budgets.charge(conn, budgets.Charge("bench-charge", device, warm, 1e300))
    for i in range(requests):
        recs = valid[i % len(valid)]
        t0, c0 = time.perf_counter(), time.process_time()
        cost = charging.records_cost(task, recs, bundle)
        cost_ms.append((time.perf_counter() - t0) * 1e3)
        cpu += time.process_time() - c0
        with db.begin(write=True) as conn:
            # the transaction's first statement also carries psycopg's BEGIN; in add_records
            # the charge never comes first, so the floor (SELECT 1) goes first here
            t0 = time.perf_counter()
            conn.execute(text("SELECT 1")).scalar_one()
            first_ms.append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()  # the floor: one statement's round trip, no work
            conn.execute(text("SELECT 1")).scalar_one()
            floor_ms.append((time.perf_counter() - t0) * 1e3)
            # one ledger (the key's) and two (the key's and a device's) in turn, so that
            # both see the same load
            for device in (("", f"d{i % 8}") if i % 2 else (f"d{i % 8}", "")):
                t0, c0 = time.perf_counter(), time.process_time()
                budgets.charge(conn, budgets.Charge("bench-charge", device, cost, 1e300))
                (both_ms if device else update_ms).append((time.perf_counter() - t0) * 1e3)
                if not device:
                    cpu += time.process_time() - c0
    one = charging.records_cost(task, valid[0][:1], bundle)

    async def predictions(n: int, at_once: int = 32) -> tuple[float, float]:
        writer = ChargeWriter(db)
        lat: list[float] = []

        async def one_request(i: int) -> None:
            t0 = time.perf_counter()
            await writer.charge(budgets.Charge("bench-predict", f"d{i % 8}", one, 1e300))
            lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        for s in range(0, n, at_once):
            await asyncio.gather(*(one_request(i) for i in range(s, min(n, s + at_once))))
        wall = time.perf_counter() - t0
        writer.close()
        return statistics.mean(lat) * 1e3, wall / n * 1e3

    mean_lat, per_charge = asyncio.run(predictions(32 * max(1, requests // 4)))
    return {"cost of 256 payloads (median)": statistics.median(cost_ms),
            "check-and-charge UPDATE in the open transaction (median)":
                statistics.median(update_ms),
            "two ledgers (key + device): check-and-charge in the open transaction (median)":
                statistics.median(both_ms),
            "CPU of both (mean)": cpu / requests * 1e3,
            "for scale: SELECT 1 in the same transaction (median)": statistics.median(floor_ms),
            "for scale: the transaction's first statement, SELECT 1 (median)":
                statistics.median(first_ms),
            "prediction charge, 32 at once: wall time per charge": per_charge,
            "prediction charge, 32 at once: mean submit -> committed": mean_lat}


# -- the real server ------------------------------------------------------------------------
def start_cloud_api(url: str, home: Path, app_key: str, admin_key: str):
    """``cloud-api serve`` on ``url``, ready: (process, base URL)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVBERT_")}
    env.update({"PRIVBERT_HOME": str(home), "PRIVBERT_DATABASE_URL": url,
                "PRIVBERT_DEFAULT_BUDGET": "1e300",
                "PRIVBERT_DB_AUTO_UPGRADE": "1", "PRIVBERT_API_KEYS": app_key,
                "PRIVBERT_ADMIN_KEYS": admin_key, "PRIVBERT_RATE_LIMIT_PER_KEY": "0",
                "PRIVBERT_WORKER_IN_SERVE": "0", "PRIVBERT_LOG_LEVEL": "WARNING",
                "PYTHONPATH": str(REPO)})
    proc = start_server([sys.executable, "-m", "cloud_api.cli", "serve", "--host", "127.0.0.1",
                  "--port", str(port)], env, port, timeout=120)
    return proc, f"http://127.0.0.1:{port}"


def through_http(base: str, pid: int, app_key: str, admin_key: str, bundle,
                 bodies: list[bytes], requests: int, clients: int) -> tuple[float, float]:
    """(records/s, records per CPU second of the server) of ``requests`` POST /v1/records
    (closed loop, ``clients`` at once)."""
    import httpx

    r = httpx.post(f"{base}/admin/tasks", headers={"Authorization": f"Bearer {admin_key}"},
                   json={"task": "bench", "labels": LABELS, "mechanism": "dchi-text",
                         "params": {"eta": ETA}, "bundle_id": bundle.bundle_id}, timeout=30)
    assert r.status_code in (200, 201), r.text
    counter = iter(range(requests))
    lock = threading.Lock()
    errors: list[str] = []

    def client() -> None:
        with httpx.Client(base_url=base, timeout=60, headers={
                "Authorization": f"Bearer {app_key}",
                "Content-Type": "application/json"}) as http:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                resp = http.post("/v1/records", content=bodies[i % len(bodies)],
                                 headers={"Idempotency-Key": f"c{clients}-{i}"})
                if resp.status_code != 201 or len(resp.json()["ids"]) != BATCH \
                        or "x-privacy-budget-remaining" not in resp.headers:
                    errors.append(f"{resp.status_code} {resp.text[:200]}")

    warm = httpx.post(f"{base}/v1/records", content=bodies[0], timeout=60, headers={
        "Authorization": f"Bearer {app_key}", "Content-Type": "application/json"})
    assert warm.status_code == 201, warm.text
    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0, c0 = time.perf_counter(), cpu_seconds(pid)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds(pid) - c0
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, first: {errors[0]}")
    return requests * BATCH / elapsed, requests * BATCH / cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=40, help="requests of 256 records per "
                    "measurement (40)")
    ap.add_argument("--databases", default="sqlite,postgresql")
    ap.add_argument("--postgres-url", help="an existing PostgreSQL (a database the bench may "
                    "fill); default: a throwaway cluster")
    args = ap.parse_args()
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f} at the start")
    t0 = time.perf_counter()
    bundle, batches = privatized_batches(4)
    n_tok = sum(r["payload"]["token_ids"]["shape"][0] for b in batches for r in b)
    print(f"privatized {sum(map(len, batches))} SST-2 train rows once ({n_tok} tokens, "
          f"dchi-text eta={ETA:g}) in {time.perf_counter() - t0:.1f} s; batches of {BATCH}, "
          f"{args.requests} requests per measurement")
    bodies = [body_of("bench", b) for b in batches]
    print(f"request body: {len(bodies[0]):,} bytes for {BATCH} records")
    rows = []
    charge_rows = []
    work = Path(tempfile.mkdtemp(prefix="privbert-bench-records-"))
    cluster = None
    try:
        for kind in args.databases.split(","):
            if kind == "sqlite":
                urls = [f"sqlite:///{work / 'direct.db'}", f"sqlite:///{work / 'http.db'}"]
            elif args.postgres_url:
                urls = [args.postgres_url, args.postgres_url]
            else:
                from tests.pg import PgCluster

                cluster = PgCluster.create(fsync=True)
                cluster.start()
                urls = [cluster.create_database("direct"), cluster.create_database("http")]
            base_rates, ms = direct(urls[0], bundle, bodies, args.requests)
            ref = base_rates["insert"][0]
            for what, (rate, per_cpu) in base_rates.items():
                rows.append([kind, f"direct: {what}", f"{rate:,.0f}", f"{per_cpu:,.0f}",
                             f"{rate / ref:.2f}x"])
            charge_rows += [[kind, what, f"{v:.3f} ms"] for what, v in ms.items()]
            app_key, admin_key = secrets.token_hex(16), secrets.token_hex(16)
            proc, base = start_cloud_api(urls[1], work / "home", app_key, admin_key)
            try:
                for clients in (1, 4):
                    rate, per_cpu = through_http(base, proc.pid, app_key, admin_key, bundle,
                                                 bodies, args.requests, clients)
                    rows.append([kind, f"HTTP POST /v1/records, {clients} client(s)",
                                 f"{rate:,.0f}", f"{per_cpu:,.0f}", f"{rate / ref:.2f}x"])
            finally:
                stop_server(proc)
            print(table(HEADERS, rows[-5:]), flush=True)
    finally:
        if cluster is not None:
            cluster.destroy()
    print()
    print(table(HEADERS, rows))
    print()
    print(table(["database", "privacy budget: what", "time a request"], charge_rows))
    http = [r for r in rows if r[1].startswith("HTTP")]
    worst = min(float(r[2].replace(",", "")) for r in http)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    print(f"target >= 2,000 records/s through HTTP into each database (with the ledger): "
          f"{'met' if worst >= 2000 else 'NOT met'} (lowest {worst:,.0f})")
    per_request = {}
    for kind, what, v in charge_rows:
        if what.startswith(("cost of", "check-and-charge")):
            per_request[kind] = per_request.get(kind, 0.0) + float(v.split()[0])
    worst_charge = max(per_request.values())
    cpu = {k: float(v.split()[0]) for k, what, v in charge_rows if what.startswith("CPU of both")}
    upd = {k: float(v.split()[0]) for k, what, v in charge_rows
           if what.startswith("check-and-charge")}
    print(f"target check-and-charge (the UPDATE, wall median) <= 0.3 ms a request: "
          f"{'met' if max(upd.values()) <= 0.3 else 'NOT met'} ("
          + ", ".join(f"{k} {v:.3f} ms" for k, v in upd.items()) + ")")
    two = {k: float(v.split()[0]) for k, what, v in charge_rows
           if what.startswith("two ledgers")}
    ratio = {k: two[k] / upd[k] for k in two}
    print("target check-and-charge with two ledgers (key + device) <= 1.2x one ledger (the "
          f"key's), same run: {'met' if max(ratio.values()) <= 1.2 else 'NOT met'} ("
          + ", ".join(f"{k} {two[k]:.3f} against {upd[k]:.3f} ms, {ratio[k]:.2f}x"
                      for k in two) + ")")
    print(f"target check-and-charge with the request's cost computed (cost + UPDATE, wall "
          f"medians) <= 0.3 ms a request: "
          f"{'met' if worst_charge <= 0.3 else 'NOT met'} (highest {worst_charge:.3f} ms: "
          + ", ".join(f"{k} {v:.3f}" for k, v in per_request.items()) + "; CPU "
          + ", ".join(f"{k} {v:.3f} ms" for k, v in cpu.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
