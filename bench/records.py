"""Record ingestion: records/s through the real HTTP server into SQLite and PostgreSQL.

SST-2 training sentences are privatized once with the edge's ``Privatizer``
(``dchi-text``, η = 65, the default MiniLM bundle) into batches of 256 labelled records;
the same request bodies are then posted again and again. For each database, in the same
run:

* baseline: the store's own insert called directly in this process
  (``store.records.add_records`` on records already validated), and the whole
  non-HTTP path (envelope parse + validation against the task + insert);
* ``cloud-api serve`` as a subprocess on a loopback port with ``PRIVBERT_DATABASE_URL``
  pointing at a fresh database: ``POST /v1/records`` (auth, body limit, envelope, every
  record checked against its task, one transaction per request), closed loop with 1 and
  with 4 concurrent clients, each sending its next request when the last is answered.

Columns: records/s (wall clock), and records per CPU second of the process that does the
work (this one for the direct paths, the server for HTTP; the PostgreSQL server's own
processes are not counted in either): on these shared 2 cores the wall-clock figures move
with the other jobs' load, the CPU figure says what one free core would sustain.

SQLite: WAL with ``synchronous = FULL`` (what the server uses). PostgreSQL 15: a throwaway
cluster (``tests/pg.py``) with its durable defaults (fsync on, synchronous_commit on), or
``--postgres-url``. Target (issue 12): >= 2,000 records/s into each through HTTP.

    python bench/records.py                      # about 2 minutes
    python bench/records.py --requests 20 --databases sqlite
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DATA, REPO, machine, read_tsv, table  # noqa: E402
from bench.serve import cpu_seconds, free_port, start, stop  # noqa: E402

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
           ) -> dict[str, tuple[float, float]]:
    """{path: (records/s, records per CPU second of this process)}."""
    from cloud_api.store import records as store
    from cloud_api.store import tasks
    from cloud_api.store.db import Database
    from shared.payload import Limits

    db = Database(url)
    db.upgrade()
    task, _ = tasks.ensure_task(db, "direct", LABELS, "dchi-text", {"eta": ETA},
                                bundle.bundle_id)
    limits = Limits.for_bundle(bundle, labels=task.labels)
    mine = [b.replace(b'"task":"bench"', b'"task":"direct"', 1) for b in bodies]
    valid = [store.validate_records(task, store.parse_body(b).records, limits) for b in mine]
    out = {}
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(requests):
        store.add_records(db, task, valid[i % len(valid)], "bench")
    n = requests * BATCH
    out["insert"] = (n / (time.perf_counter() - t0), n / (time.process_time() - c0))
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(requests):
        env = store.parse_body(mine[i % len(mine)])
        recs = store.validate_records(task, env.records, limits)
        store.add_records(db, task, recs, "bench", f"direct-{i}", store.body_digest(env))
    out["parse+validate+insert"] = (n / (time.perf_counter() - t0),
                                    n / (time.process_time() - c0))
    db.dispose()
    return out


# -- the real server ------------------------------------------------------------------------
def start_server(url: str, home: Path, app_key: str, admin_key: str):
    """``cloud-api serve`` on ``url``, ready: (process, base URL)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIVBERT_")}
    env.update({"PRIVBERT_HOME": str(home), "PRIVBERT_DATABASE_URL": url,
                "PRIVBERT_DB_AUTO_UPGRADE": "1", "PRIVBERT_API_KEYS": app_key,
                "PRIVBERT_ADMIN_KEYS": admin_key, "PRIVBERT_RATE_LIMIT_PER_KEY": "0",
                "PRIVBERT_WORKER_IN_SERVE": "0", "PRIVBERT_LOG_LEVEL": "WARNING",
                "PYTHONPATH": str(REPO)})
    proc = start([sys.executable, "-m", "cloud_api.cli", "serve", "--host", "127.0.0.1",
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
                if resp.status_code != 201 or len(resp.json()["ids"]) != BATCH:
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
            base_rates = direct(urls[0], bundle, bodies, args.requests)
            ref = base_rates["insert"][0]
            for what, (rate, per_cpu) in base_rates.items():
                rows.append([kind, f"direct: {what}", f"{rate:,.0f}", f"{per_cpu:,.0f}",
                             f"{rate / ref:.2f}x"])
            app_key, admin_key = secrets.token_hex(16), secrets.token_hex(16)
            proc, base = start_server(urls[1], work / "home", app_key, admin_key)
            try:
                for clients in (1, 4):
                    rate, per_cpu = through_http(base, proc.pid, app_key, admin_key, bundle,
                                                 bodies, args.requests, clients)
                    rows.append([kind, f"HTTP POST /v1/records, {clients} client(s)",
                                 f"{rate:,.0f}", f"{per_cpu:,.0f}", f"{rate / ref:.2f}x"])
            finally:
                stop(proc)
            print(table(HEADERS, rows[-4:]), flush=True)
    finally:
        if cluster is not None:
            cluster.destroy()
    print()
    print(table(HEADERS, rows))
    http = [r for r in rows if r[1].startswith("HTTP")]
    worst = min(float(r[2].replace(",", "")) for r in http)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    print(f"target >= 2,000 records/s through HTTP into each database: "
          f"{'met' if worst >= 2000 else 'NOT met'} (lowest {worst:,.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
