"""The privacy budget against a hostile client, through a real `cloud-api serve` on a real
PostgreSQL (migrated by `cloud-api db upgrade`), with a queue of 4 payloads per model:

* new X-Device-Id values add nothing to what a key may spend (its cap is the key's), and a
  refused one leaves no ledger row behind;
* overload: a request refused for load (429) or larger than the queue (413, naming the
  limit) is never charged; what the key's ledger holds is exactly what was answered;
* one malformed corpus to predict and to records: the same verdicts, nothing refused stored;
  lengths the model serving the task cannot read, and the tolerance of eta, the same on
  both routes; a refused request leaves no row anywhere;
* the server's budget-exhausted 403 makes the real `edge-agent` and the real `privbert-edge`
  (the Node edge) exit 3 naming what remains.

The device side of the same attacks (memo variants, clock moves, file modes) is
tests/edge_agent/test_budget_attacks.py."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from cloud_api.auth import key_id
from cloud_api.errors import problem_type
from shared import ledger
from shared.accounting import bundle_diameter
from shared.payload import make_payload
from tests.cloud_api.conftest import ETA, ServerProcess, cli_env, cloud_api, new_keys
from tests.conftest import REPO

REMAINING = "x-privacy-budget-remaining"
QUEUE = 4


@pytest.fixture(scope="module")
def srv(tiny_home, pg_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attacks")
    url = pg_cluster.create_database("budget_attacks")
    up = cloud_api("db", "upgrade", "--database-url", url)
    assert up.returncode == 0, up.stderr
    s = ServerProcess(tiny_home.root, tmp / "serve.log", new_keys(app=7), {
        "PRIVBERT_DATABASE_URL": url, "PRIVBERT_RATE_LIMIT_PER_KEY": "0",
        "PRIVBERT_WORKER_IN_SERVE": "0", "PRIVBERT_MAX_QUEUE_SIZE": str(QUEUE),
        "PRIVBERT_MAX_CONCURRENT_REQUESTS": "256", "PRIVBERT_INFERENCE_WORKERS": "1"})
    s.start()
    s.database_url = url
    yield s
    s.stop()


def admin(srv, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, f"{srv.url}{path}", headers=srv.headers(srv.admin_key),
                         timeout=30, **kw)


def predict(srv, key: str, payloads, device: str | None = None) -> httpx.Response:
    headers = {**srv.headers(key), "Content-Type": "application/json"}
    if device:
        headers["X-Device-Id"] = device
    body = '{"payloads":[' + ",".join(p.model_dump_json(exclude_none=True)
                                      for p in payloads) + "]}"
    return httpx.post(f"{srv.url}/v1/models/text/predict", content=body, headers=headers,
                      timeout=60)


def text_payloads(bundle, n: int) -> list:
    from edge_agent import Privatizer
    from shared.mechanisms import DChiText

    texts = ["the movie is good", "a bad plot", "fun story", "dull actor"]
    return Privatizer(bundle, DChiText(bundle, ETA)).privatize([texts[i % 4] for i in range(n)])


def cost_of(payloads, bundle) -> float:
    d = bundle_diameter(bundle)
    return sum(ledger.payload_cost(p, d, mechanism="dchi-text", params={"eta": ETA}).epsilon
               for p in payloads)


def key_view(srv, key: str) -> dict:
    r = admin(srv, "GET", f"/admin/budgets/{key_id(key)}")
    assert r.status_code == 200, r.text
    return r.json()


def test_rotating_device_ids_never_pass_the_keys_cap(srv, tiny_bundle_of_home):
    """100 predictions, each from a new X-Device-Id, as many at a time as the queue holds (more
    could be told 429 "queue full" on a loaded machine), against a key's cap that
    admits 10: exactly 10 answered, the key's ledger (and its devices in all) at most the
    cap, every answer and every 403 with X-Privacy-Budget-Remaining; a device's own cap is
    shown beside the key's and never above it."""
    key, b = srv.keys["app"][0], tiny_bundle_of_home
    one = text_payloads(b, 1)
    c = cost_of(one, b)
    cap = 10.5 * c
    r = admin(srv, "PUT", f"/admin/budgets/{key_id(key)}", json={"cap": cap})
    assert r.status_code == 200, r.text
    with ThreadPoolExecutor(QUEUE) as pool:
        got = list(pool.map(lambda i: predict(srv, key, one, f"dev-{i}"), range(100)))
    codes = [g.status_code for g in got]
    assert codes.count(200) == 10 and codes.count(403) == 90, codes
    for g in got:
        assert REMAINING in g.headers, (g.status_code, g.text)
        if g.status_code == 403:
            assert g.json()["type"] == problem_type("budget-exhausted")
    view = key_view(srv, key)
    print(f"\nrotating device ids: {codes.count(200)} of 100 answered; the key's spend "
          f"{view['spent']:.6g} = {view['spent'] / cap:.3f} of its cap C; device rows "
          f"{len(view['devices'])}")
    assert view["spent"] <= cap and view["spent"] == pytest.approx(10 * c, rel=1e-9)
    assert sum(d["spent"] for d in view["devices"]) == pytest.approx(view["spent"], rel=1e-9)
    # a refused device id leaves no row behind (issue 34: 50 of 50 refusals left one)
    assert len(view["devices"]) == 10 and all(d["sends"] == 1 for d in view["devices"])
    r = admin(srv, "PUT", f"/admin/budgets/{key_id(key)}/devices/dev-1", json={"cap": cap * 2})
    assert r.status_code == 422 and "never above its key" in r.json()["detail"]
    r = admin(srv, "PUT", f"/admin/budgets/{key_id(key)}/devices/dev-1", json={"cap": c / 2})
    assert r.status_code == 200, r.text
    dev = next(d for d in r.json()["devices"] if d["device_id"] == "dev-1")
    assert dev["cap"] == c / 2 and r.json()["cap"] == cap


def test_overload_charges_only_what_is_answered(srv, tiny_bundle_of_home):
    """64 requests of 4 payloads at concurrency 32 on a queue of 4 payloads, and requests of
    8 payloads (which no queue of 4 can ever take): the 8-payload ones get 413 naming the
    limit, some of the others 429; the key's ledger holds exactly the answered payloads,
    and every answer carries X-Privacy-Budget-Remaining."""
    key, b = srv.keys["app"][1], tiny_bundle_of_home
    r = admin(srv, "PUT", f"/admin/budgets/{key_id(key)}", json={"cap": 1e9})
    assert r.status_code == 200, r.text
    four, eight = text_payloads(b, 4), text_payloads(b, 8)
    big = predict(srv, key, eight)
    assert big.status_code == 413 and big.json()["type"] == problem_type("too-many-payloads")
    assert f"at most {QUEUE}" in big.json()["detail"], big.text
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda i: predict(srv, key, four, f"o-{i % 3}"), range(64)))
    codes = [g.status_code for g in got]
    assert set(codes) <= {200, 429}, codes
    answered = codes.count(200)
    assert answered >= 1 and all(REMAINING in g.headers for g in got if g.status_code == 200)
    view = key_view(srv, key)
    print(f"\noverload: {answered} x 200, {codes.count(429)} x 429, 1 x 413; payloads "
          f"charged {view['sends']}, answered {4 * answered}, charged without an answer "
          f"{view['sends'] - 4 * answered}")
    assert view["sends"] == 4 * answered, (view["sends"], answered, codes.count(429))
    assert view["spent"] == pytest.approx(answered * cost_of(four, b), rel=1e-9)


def _corpus(bundle, model_max_length: int) -> dict[str, dict]:
    """Payload dicts, one per case: valid, and each malformation the issue found stored."""
    sp = bundle.special_ids
    regular = np.asarray(bundle.regular_ids, dtype=np.int64)
    words = regular[:5]
    too_long = max(model_max_length, bundle.max_length) - 1

    def ids(arr, segments=None, eta=ETA):
        return make_payload("dchi-text", {"eta": eta}, bundle.bundle_id,
                            np.asarray(arr, dtype=np.int64), segments
                            ).model_dump(mode="json", exclude_none=True)

    return {
        "valid": ids(words),
        "cls x21 as a pair": ids([sp["cls"]] * 21, [10, 11]),
        "cls and sep ids": ids([sp["cls"], *words, sp["sep"]]),
        "a pair on a single-sentence task": ids([*words, *words], [5, 5]),
        "an [unused] id": ids([*words, bundle.meta["unused_ids"][0]]),
        "a [PAD] id": ids([*words, sp["pad"]]),
        "longer than max_length": ids(np.resize(words, too_long)),
        "another eta": ids(words, eta=ETA * 2),
    }


def test_records_and_predict_give_one_verdict_on_a_malformed_corpus(srv, tiny_bundle_of_home):
    """The same payloads to predict and to records (a task of the model's mechanism,
    parameters and bundle): every case gets the same verdict on both routes, and records
    stores exactly the accepted ones."""
    key, b = srv.keys["app"][2], tiny_bundle_of_home
    model = next(m for m in httpx.get(f"{srv.url}/v1/models", headers=srv.headers(key),
                                      timeout=30).json()["models"] if m["id"] == "text")
    task = f"t-{uuid.uuid4().hex[:8]}"
    r = admin(srv, "POST", "/admin/tasks", json={
        "task": task, "labels": model["labels"], "mechanism": "dchi-text",
        "params": model["params"], "bundle_id": b.bundle_id})
    assert r.status_code == 201, r.text
    verdicts = {}
    for name, p in _corpus(b, int(model["max_length"])).items():
        pr = httpx.post(f"{srv.url}/v1/models/text/predict", headers=srv.headers(key),
                        json={"payloads": [p]}, timeout=30)
        rr = httpx.post(f"{srv.url}/v1/records", headers=srv.headers(key), json={
            "task": task, "records": [{"payload": p, "label": model["labels"][0]}]},
            timeout=30)
        assert pr.status_code in (200, 422) and rr.status_code in (201, 422), (name, pr.text,
                                                                               rr.text)
        verdicts[name] = (pr.status_code == 200, rr.status_code == 201)
    tasks = admin(srv, "GET", "/admin/tasks").json()["tasks"]
    stored = next(t for t in tasks if t["task"] == task)["records"]
    print(f"\nmalformed corpus: {len(verdicts) - 1} malformed cases, verdicts (predict, "
          f"records) {verdicts}; stored {stored}, of them malformed {stored - 1}")
    assert verdicts["valid"] == (True, True)
    assert all(p == r for p, r in verdicts.values()), verdicts
    assert stored == sum(r for _, r in verdicts.values()) == 1


def test_the_servers_budget_refusal_makes_edge_agent_exit_3(srv, tmp_path):
    """A key whose cap is spent: `edge-agent privatize --post predict` exits 3 (as the
    device's own cap does) with one line naming what remains on the server."""
    key = srv.keys["app"][3]
    r = admin(srv, "PUT", f"/admin/budgets/{key_id(key)}", json={"cap": 0.0})
    assert r.status_code == 200, r.text
    src = tmp_path / "in.txt"
    src.write_text("the movie is good\n")
    p = subprocess.run(
        [sys.executable, "-m", "edge_agent", "privatize", str(src), "--server", srv.url,
         "--api-key", key, "--post", "predict", "--model", "text", "--eta", str(ETA),
         "--ledger", str(tmp_path / "ledger.sqlite3"), "--retries", "0"],
        cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 3, (p.returncode, p.stderr)
    last = p.stderr.strip().splitlines()[-1]
    assert "403" in last and "remaining 0" in last and "may not use" not in last, last


def test_the_servers_budget_refusal_makes_privbert_edge_exit_3(srv, tmp_path):
    """The Node edge as edge-agent (issue 34, finding 7): exit 3 and one line naming what
    remains, never the "may not use that endpoint" hint; nothing written to -o."""
    from tests.web_edge.conftest import CLI, _node_ready

    why = _node_ready()
    if why is not None:
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    key = srv.keys["app"][4]
    r = admin(srv, "PUT", f"/admin/budgets/{key_id(key)}", json={"cap": 0.0})
    assert r.status_code == 200, r.text
    src, out = tmp_path / "in.txt", tmp_path / "out.jsonl"
    src.write_text("the movie is good\n")
    p = subprocess.run(
        ["node", str(CLI), "privatize", str(src), "--server", srv.url, "--api-key", key,
         "--post", "predict", "--model", "text", "--eta", str(ETA), "--ledger",
         str(tmp_path / "ledger.json"), "--retries", "0", "-o", str(out)],
        cwd=REPO, env=cli_env({"PRIVBERT_CACHE": str(tmp_path / "cache")}),
        capture_output=True, text=True, timeout=180)
    assert p.returncode == 3, (p.returncode, p.stderr)
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("privbert-edge: error: server answered 403"), last
    assert "remaining 0" in last and "may not use" not in last, last
    assert not out.exists() or out.read_text() == ""


def _rows_of(srv, kid: str) -> dict[str, int]:
    """The rows a key id has in the database, by table."""
    from sqlalchemy import func, select

    from cloud_api.store.db import Database
    from cloud_api.store.tables import budgets, records

    db = Database(srv.database_url)
    try:
        with db.begin() as conn:
            return {t.name: int(conn.execute(select(func.count()).select_from(t).where(
                t.c.key_id == kid)).scalar_one()) for t in (budgets, records)}
    finally:
        db.dispose()


def test_records_are_held_to_the_length_and_eta_that_predict_reads(srv, tiny_bundle_of_home):
    """The finding: with the model's max_length shorter than its bundle's, records stored
    payloads that predict refused by length, and an eta within float rounding of the task's
    passed predict and was refused by records. Here the emb model reads at most 14 tokens
    (max_length 16) of a bundle that allows 62: payloads of 1 to 62 tokens, eta 5 + 1e-12
    and 5 x (1 + 1e-6), and finite values so large they would make the model's scores NaN
    (a bad input: 422, never a 500), get one verdict from predict and from records (a task
    of the model's mechanism, parameters and bundle, named as the model's); what is refused
    (sent with a key of its own) leaves no row in any table."""
    from tests.cloud_api.conftest import EMB_MAX_LENGTH

    good, bad = srv.keys["app"][5], srv.keys["app"][6]
    b = tiny_bundle_of_home
    model = next(m for m in httpx.get(f"{srv.url}/v1/models", headers=srv.headers(good),
                                      timeout=30).json()["models"] if m["id"] == "emb")
    assert model["max_length"] == EMB_MAX_LENGTH < b.max_length
    r = admin(srv, "POST", "/admin/tasks", json={
        "task": model["task"], "labels": model["labels"], "mechanism": model["mechanism"],
        "params": model["params"], "bundle_id": b.bundle_id})
    assert r.status_code in (200, 201), r.text
    rng = np.random.default_rng(0)
    eta = float(model["params"]["eta"])
    cases = {f"{n} tokens": (n, eta, 1.0) for n in (1, EMB_MAX_LENGTH - 2, EMB_MAX_LENGTH - 1,
                                                      20, 40, b.max_length - 2)}
    cases.update({"eta + 1e-12": (4, eta + 1e-12, 1.0),
                  "eta x (1 + 1e-6)": (4, eta * (1 + 1e-6), 1.0),
                  "values of 3e38 (finite, overflow a LayerNorm)": (4, eta, 3e38)})

    def send(key: str, body: dict) -> tuple[int, int]:
        headers = {**srv.headers(key), "X-Device-Id": f"d-{key[-6:]}"}
        pr = httpx.post(f"{srv.url}/v1/models/emb/predict", headers=headers,
                        json={"payloads": [body]}, timeout=30)
        rr = httpx.post(f"{srv.url}/v1/records", headers=headers, json={
            "task": model["task"], "records": [{"payload": body, "label": model["labels"][0]}]},
            timeout=30)
        return pr.status_code, rr.status_code

    verdicts, refused, stored_before = {}, [], _task_records(srv, model["task"])
    for name, (n, e, scale) in cases.items():
        values = rng.normal(0, 1, (n, b.dim)) if scale == 1.0 else np.full((n, b.dim), scale)
        body = make_payload("dchi-embedding", {"eta": e}, b.bundle_id,
                            values.astype(np.float32)).model_dump(mode="json", exclude_none=True)
        verdicts[name] = send(good, body)
        if verdicts[name] == (422, 422):
            refused.append(send(bad, body))
    print(f"\nrecords and predict, model max_length {model['max_length']}, bundle "
          f"{b.max_length}: {verdicts}")
    want = {name: (200, 201) if (n <= EMB_MAX_LENGTH - 2 and e in (eta, eta + 1e-12)
                                 and scale == 1.0)
            else (422, 422) for name, (n, e, scale) in cases.items()}
    assert verdicts == want
    assert refused == [(422, 422)] * sum(v == (422, 422) for v in want.values())
    accepted = sum(v == (200, 201) for v in verdicts.values())
    assert _task_records(srv, model["task"]) == stored_before + accepted
    assert _rows_of(srv, key_id(bad)) == {"budgets": 0, "records": 0}


def _task_records(srv, task: str) -> int:
    tasks = admin(srv, "GET", "/admin/tasks").json()["tasks"]
    return next(t for t in tasks if t["task"] == task)["records"]
