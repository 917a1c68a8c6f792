"""The client side of scripts/k8s_smoke.sh: traffic through two serve pods on loopback
ports, and the checks that need it. Every request loop is bounded in count and time.

    python scripts/k8s_smoke_client.py traffic URL0 URL1 --records R.jsonl --predict P.jsonl
    python scripts/k8s_smoke_client.py promotion URL0 URL1 --version v2 --since EPOCH
    python scripts/k8s_smoke_client.py kill URL0 URL1 --records R.jsonl --predict P.jsonl \
        --kill "podman pod kill NAME" --psql "podman exec ... psql ..."
    python scripts/k8s_smoke_client.py rate URL0 URL1 --rate 5 --burst 30
    python scripts/k8s_smoke_client.py budget URL0 URL1 --predict P.jsonl

Keys come from the environment: SMOKE_APP (traffic), SMOKE_RATE_KEY, SMOKE_BUDGET_KEY,
SMOKE_ADMIN. Each command prints one line per finding and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx

MODEL = "smoke"
TASK = "smoke"


def _key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ[name]}"}


def _lines(path: str) -> list[dict]:
    return [json.loads(x) for x in open(path) if x.strip()]


THROTTLED = [0]  # 429 answers waited out by _send


def _send(method: str, url: str, key: str, **kw) -> httpx.Response:
    """One request, as a client should send it: a 429 is waited out (its Retry-After) and
    sent again, for at most 120 s. The smoke's rate limit is low on purpose (the rate
    check must be able to exceed it on a busy machine), so every phase meets it."""
    deadline = time.monotonic() + 120
    headers = {**_key(key), **kw.pop("headers", {})}
    while True:
        r = httpx.request(method, url, headers=headers, timeout=30, **kw)
        if r.status_code != 429 or time.monotonic() > deadline:
            return r
        THROTTLED[0] += 1
        time.sleep(min(5.0, float(r.headers.get("retry-after", "1"))))


_LOADED = re.compile(r'^privbert_model_loaded\{([^}]*)\} 1\.0$', re.M)


def _served(url: str) -> str | None:
    """The version of the model a pod serves, from /metrics (open, never rate limited)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    for labels in _LOADED.findall(text):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if found.get("model") == MODEL:
            return found.get("version")
    return None


def _predict(url: str, payload: dict, key: str = "SMOKE_APP") -> httpx.Response:
    return _send("POST", f"{url}/v1/models/{MODEL}/predict", key,
                 json={"payloads": [payload]})


def cmd_traffic(a) -> int:
    """Predictions and records through both pods: every one answered, records stored."""
    records, preds = _lines(a.records), _lines(a.predict)
    ok = {a.urls[0]: 0, a.urls[1]: 0}
    versions = set()
    for i, p in enumerate(preds * 4):
        url = a.urls[i % 2]
        r = _predict(url, p["payload"])
        if r.status_code != 200:
            print(f"FAIL predict through {url}: {r.status_code} {r.text[:200]}")
            return 1
        versions.add(r.json()["version"])
        ok[url] += 1
    stored = 0
    for i in range(0, len(records), 4):
        url = a.urls[(i // 4) % 2]
        r = _send("POST", f"{url}/v1/records", "SMOKE_APP",
                  headers={"Idempotency-Key": str(uuid.uuid4())},
                  json={"task": TASK, "records": records[i:i + 4]})
        if r.status_code != 201:
            print(f"FAIL records through {url}: {r.status_code} {r.text[:200]}")
            return 1
        stored += len(r.json()["ids"])
        ok[url] += 1
    print(f"traffic: {sum(ok.values())} requests answered ({ok[a.urls[0]]} by pod 0, "
          f"{ok[a.urls[1]]} by pod 1): {len(preds) * 4} predictions (versions "
          f"{sorted(versions)}), {stored} records stored ({THROTTLED[0]} 429s waited out)")
    return 0


def cmd_promotion(a) -> int:
    """Seconds from ``--since`` (the job's end) until both pods serve ``--version``."""
    deadline = time.time() + a.timeout
    seen: dict[str, float] = {}
    while len(seen) < 2 and time.time() < deadline:
        for url in a.urls:
            if url not in seen and _served(url) == a.version:
                seen[url] = time.time()
        time.sleep(0.2)
    if len(seen) < 2:
        print(f"FAIL promotion: {a.version} not served by both pods within {a.timeout} s "
              f"(pod 0: {_served(a.urls[0])}, pod 1: {_served(a.urls[1])})")
        return 1
    lags = [seen[u] - a.since for u in a.urls]
    print(f"promotion: {a.version} served by pod 0 {lags[0]:.1f} s and pod 1 "
          f"{lags[1]:.1f} s after the job ended (target <= 10 s): "
          f"{'met' if max(lags) <= 10 else 'NOT met'}")
    return 0 if max(lags) <= 10 else 1


def cmd_kill(a) -> int:
    """Records (each with its Idempotency-Key, retried on the other pod when a pod fails)
    and predictions through both pods; pod 1 is killed after ``--kill-after`` requests.
    Then every accepted record is in the database once, and none other is."""
    records, preds = _lines(a.records), _lines(a.predict)
    accepted: dict[str, list[int]] = {}
    failures = {"retried": 0, "predict_errors": 0, "predict_ok_after_kill": 0}
    killed = threading.Event()
    t0 = time.time()
    for i in range(a.requests):
        if i == a.kill_after:
            subprocess.Popen(a.kill, shell=True)  # noqa: S602 - the smoke's own command
            killed.set()
        idem = f"kill-{i}-{uuid.uuid4()}"
        body = {"task": TASK, "records": [records[i % len(records)]]}
        order = [a.urls[i % 2], a.urls[(i + 1) % 2]]
        for attempt in range(6):
            url = order[attempt % 2]
            try:
                r = _send("POST", f"{url}/v1/records", "SMOKE_APP", json=body,
                          headers={"Idempotency-Key": idem})
            except httpx.HTTPError:
                failures["retried"] += 1
                continue
            if r.status_code in (200, 201):
                accepted[idem] = r.json()["ids"]
                break
            if r.status_code >= 500:
                failures["retried"] += 1
                continue
            print(f"FAIL records: {r.status_code} {r.text[:200]}")
            return 1
        else:
            print(f"FAIL records: request {i} not accepted by either pod")
            return 1
        p = preds[i % len(preds)]["payload"]
        try:
            pr = _predict(a.urls[0], p)
            if pr.status_code == 200 and killed.is_set():
                failures["predict_ok_after_kill"] += 1
            elif pr.status_code != 200:
                failures["predict_errors"] += 1
        except httpx.HTTPError:
            failures["predict_errors"] += 1
        if time.time() - t0 > a.timeout:
            print(f"FAIL kill: {a.timeout} s passed")
            return 1
    ids = sorted(x for v in accepted.values() for x in v)
    out = subprocess.run(a.psql + f" -c 'SELECT id FROM records WHERE id >= {ids[0]} "
                         "ORDER BY id'", shell=True, capture_output=True, text=True)  # noqa: S602
    in_db = [int(x) for x in out.stdout.split()]
    lost = sorted(set(ids) - set(in_db))
    extra = sorted(set(in_db) - set(ids))
    dup = len(ids) - len(set(ids))
    print(f"kill: {len(accepted)} record requests accepted ({failures['retried']} retried on "
          f"the other pod after pod 1 was killed at request {a.kill_after}); in the database "
          f"{len(in_db)} records from the first accepted id: lost {len(lost)}, duplicated "
          f"{dup + len(extra)}; predictions through pod 0 meanwhile: "
          f"{failures['predict_errors']} errors, {failures['predict_ok_after_kill']} "
          f"answered after the kill ({THROTTLED[0]} 429s waited out)")
    bad = lost or extra or dup or failures["predict_errors"] or \
        not failures["predict_ok_after_kill"] or out.returncode != 0
    return 1 if bad else 0


def cmd_rate(a) -> int:
    """One key's requests through both pods at once: admitted <= burst + rate * elapsed."""
    codes: list[int] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        r = httpx.get(f"{a.urls[i % 2]}/v1/models", headers=_key("SMOKE_RATE_KEY"), timeout=30)
        with lock:
            codes.append(r.status_code)

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(a.requests)))
    elapsed = time.monotonic() - t0
    admitted = codes.count(200)
    bound = a.burst + a.rate * elapsed
    print(f"rate: {a.requests} requests of one key through both pods in {elapsed:.1f} s: "
          f"{admitted} admitted, {codes.count(429)} refused 429 (one bucket allows at most "
          f"{a.burst} + {a.rate:g}/s x {elapsed:.1f} s = {bound:.1f}; a bucket per pod "
          f"would allow {2 * a.burst} + {2 * a.rate:g}/s x {elapsed:.1f} s)")
    if not codes.count(429):
        print("FAIL rate: no request was refused, so the check proved nothing (the pods "
              "answered more slowly than the rate)")
        return 1
    ok = admitted <= bound and set(codes) <= {200, 429}
    return 0 if ok else 1


def cmd_budget(a) -> int:
    """A key with a cap of 5.5 predictions' cost, spent through both pods at once: never
    over the cap, every answered prediction charged exactly once."""
    from cloud_api.auth import key_id

    kid = key_id(os.environ["SMOKE_BUDGET_KEY"])
    p = _lines(a.predict)[0]["payload"]
    first = _predict(a.urls[0], p, "SMOKE_BUDGET_KEY")
    assert first.status_code == 200, first.text
    cost = _send("GET", f"{a.urls[0]}/admin/budgets/{kid}", "SMOKE_ADMIN").json()["spent"]
    cap = 5.5 * cost
    r = _send("PUT", f"{a.urls[1]}/admin/budgets/{kid}", "SMOKE_ADMIN", json={"cap": cap})
    assert r.status_code == 200, r.text
    codes: list[int] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        res = _predict(a.urls[i % 2], p, "SMOKE_BUDGET_KEY")
        with lock:
            codes.append(res.status_code)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(a.requests)))
    view = _send("GET", f"{a.urls[1]}/admin/budgets/{kid}", "SMOKE_ADMIN").json()
    answered = codes.count(200) + 1
    exact = abs(view["spent"] - answered * cost) <= 1e-9 * max(1.0, cap)
    print(f"budget: cap {cap:.4g} (5.5 predictions of cost {cost:.4g}); {a.requests} "
          f"predictions at once through both pods: {codes.count(200)} answered, "
          f"{codes.count(403)} refused 403 budget-exhausted; spent {view['spent']:.4g} = "
          f"{answered} x cost ({'exact' if exact else 'NOT exact'}), "
          f"{'within' if view['spent'] <= cap else 'OVER'} the cap")
    return 0 if view["spent"] <= cap and exact and set(codes) <= {200, 403} else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["traffic", "promotion", "kill", "rate", "budget"])
    ap.add_argument("urls", nargs=2)
    ap.add_argument("--records")
    ap.add_argument("--predict")
    ap.add_argument("--version")
    ap.add_argument("--since", type=float)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--kill")
    ap.add_argument("--kill-after", type=int, default=12)
    ap.add_argument("--psql")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=5)
    ap.add_argument("--burst", type=float, default=30)
    a = ap.parse_args()
    return {"traffic": cmd_traffic, "promotion": cmd_promotion, "kill": cmd_kill,
            "rate": cmd_rate, "budget": cmd_budget}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
