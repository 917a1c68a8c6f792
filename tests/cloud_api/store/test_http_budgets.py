"""The privacy budget ledgers through the real `cloud-api serve` of the session (SQLite; the
same check-and-charge on PostgreSQL is tested in test_budgets.py, and test_http_records.py
charges every request of its PostgreSQL server too):
records and predictions charged from the task's or model's mechanism and the payloads,
X-Privacy-Budget-Remaining, 403 budget-exhausted with nothing stored, a replay charged
once, devices, PRIVBERT_DEFAULT_BUDGET, the /admin/budgets routes and the spend metrics.

Charged figures are recomputed here with shared.ledger from the payloads sent; the server
sums the same float64 costs, so they agree to a relative 1e-12."""

from __future__ import annotations

import httpx
import pytest

from cloud_api.auth import key_id
from shared import ledger
from shared.accounting import bundle_diameter
from tests.cloud_api.conftest import DEFAULT_BUDGET as DEFAULT
from tests.cloud_api.conftest import ETA, body_of, payloads_for
from tests.cloud_api.store.test_http_records import (
    assert_problem,
    call,
    counts,
    declare,
    records_body,
    text_payloads,
)

REMAINING = "x-privacy-budget-remaining"


@pytest.fixture
def bsrv(server):
    """The session's main server (tests/cloud_api/conftest.py): its SQLite database,
    PRIVBERT_DEFAULT_BUDGET, and app keys 1-3 for these tests."""
    return server


def cost_of(payloads, bundle, eta=ETA) -> float:
    d = bundle_diameter(bundle)
    return sum(ledger.payload_cost(p, d, mechanism="dchi-text", params={"eta": eta}).epsilon
               for p in payloads)


def post(srv, key, body, idem=None, device=None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if idem:
        headers["Idempotency-Key"] = idem
    if device:
        headers["X-Device-Id"] = device
    return call(srv, "POST", "/v1/records", key, content=body, headers=headers)


def view(srv, key) -> dict:
    r = call(srv, "GET", f"/admin/budgets/{key_id(key)}", srv.admin_key)
    assert r.status_code == 200, r.text
    return r.json()


def put_cap(srv, key, cap) -> dict:
    r = call(srv, "PUT", f"/admin/budgets/{key_id(key)}", srv.admin_key, json={"cap": cap})
    assert r.status_code == 200, r.text
    return r.json()


def test_records_are_charged_and_over_the_cap_nothing_is_stored(bsrv, tiny_bundle_of_home):
    b, key = tiny_bundle_of_home, bsrv.keys["app"][1]
    name = declare(bsrv, b)
    payloads = text_payloads(b, 4)
    body, cost = records_body(name, payloads), cost_of(payloads, b)
    r = post(bsrv, key, body, idem="b-1", device="phone-1")
    assert r.status_code == 201, r.text
    assert float(r.headers[REMAINING]) == pytest.approx(DEFAULT - cost, rel=1e-12)
    r2 = post(bsrv, key, body, idem="b-1", device="phone-1")  # a replay: charged once
    assert r2.headers["idempotent-replayed"] == "true" and REMAINING not in r2.headers
    v = view(bsrv, key)
    dev = v["devices"][0]
    # the device has no cap of its own (the key's bounds it); the key's ledger counts it
    assert dev["device_id"] == "phone-1" and dev["cap"] is None and v["cap"] == DEFAULT
    assert dev["spent"] == pytest.approx(cost, rel=1e-12) and dev["sends"] == 4
    assert dev["families"]["dchi"]["tokens"] == sum(p.n_tokens for p in payloads)
    assert v["spent"] == v["total"]["spent"] == pytest.approx(cost, rel=1e-12)
    # a cap half a request above what the key spent: the next request is refused whole
    put_cap(bsrv, key, v["spent"] + cost / 2)
    before = counts(bsrv, name)
    r = post(bsrv, key, body, idem="b-2", device="phone-1")
    problem = assert_problem(r, 403, "budget-exhausted")
    assert problem["remaining"] == pytest.approx(cost / 2, rel=1e-9)
    assert float(r.headers[REMAINING]) == problem["remaining"]
    assert "nothing was stored" in problem["detail"]
    assert counts(bsrv, name) == before
    assert view(bsrv, key)["devices"][0]["spent"] == dev["spent"]
    assert post(bsrv, key, body, device="phone-2").status_code == 403  # the key's cap holds
    put_cap(bsrv, key, None)
    r = post(bsrv, key, body, idem="b-2", device="phone-1")  # nothing was kept for b-2
    assert r.status_code == 201 and "idempotent-replayed" not in r.headers
    assert REMAINING not in r.headers  # no cap: counted, no remaining to state
    assert sum(counts(bsrv, name).values()) == sum(before.values()) + 4
    assert_problem(post(bsrv, key, body, device="bad id!"), 422, "validation")


def test_predictions_are_charged_before_they_are_answered(bsrv, tiny_bundle_of_home):
    b, key = tiny_bundle_of_home, bsrv.keys["app"][2]
    model = bsrv.model("text")
    payloads = payloads_for(model, ["a good film", "the plot was dull"], b)
    cost = cost_of(payloads, b, model["params"]["eta"])
    spent_metric = bsrv.metric("privbert_privacy_spent_epsilon_total", family="dchi",
                               route="predict")
    r = call(bsrv, "POST", "/v1/models/text/predict", key, content=body_of(payloads),
             headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert float(r.headers[REMAINING]) == pytest.approx(DEFAULT - cost, rel=1e-12)
    assert view(bsrv, key)["spent"] == pytest.approx(cost, rel=1e-12)
    assert bsrv.metric("privbert_privacy_spent_epsilon_total", family="dchi",
                       route="predict") == pytest.approx(spent_metric + cost, rel=1e-9)
    put_cap(bsrv, key, view(bsrv, key)["spent"])
    refused = bsrv.metric("privbert_budget_exhausted_total", route="predict")
    r = call(bsrv, "POST", "/v1/models/text/predict", key, content=body_of(payloads),
             headers={"Content-Type": "application/json"})
    assert assert_problem(r, 403, "budget-exhausted")["remaining"] == 0.0
    assert bsrv.metric("privbert_budget_exhausted_total", route="predict") == refused + 1
    # a payload the model does not read is refused as such (422), before any charge
    other = payloads_for({**model, "params": {"eta": ETA + 1}}, ["a good film"], b)
    r = call(bsrv, "POST", "/v1/models/text/predict", key, content=body_of(other),
             headers={"Content-Type": "application/json"})
    assert_problem(r, 422, "payload-mismatch")
    reset = call(bsrv, "POST", f"/admin/budgets/{key_id(key)}/reset", bsrv.admin_key)
    assert reset.status_code == 200 and reset.json()["spent"] == 0.0
    r = call(bsrv, "POST", "/v1/models/text/predict", key, content=body_of(payloads),
             headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_admin_budget_routes(bsrv):
    admin, app = bsrv.admin_key, bsrv.keys["app"][3]
    r = call(bsrv, "GET", "/admin/budgets", admin)
    listed = {v["key_id"]: v for v in r.json()["budgets"]}
    assert key_id(app) in listed and listed[key_id(app)]["cap"] == DEFAULT  # the default
    assert_problem(call(bsrv, "GET", "/admin/budgets/nosuchkey", admin), 404, "not-found")
    assert call(bsrv, "GET", "/admin/budgets", app).status_code == 403
    path = f"/admin/budgets/{key_id(app)}"
    for bad in ('{"cap": -1}', '{"cap": NaN}', '{"cap": Infinity}', '{"cap": 1e999}',
                '{"cap": "10"}', '{"cap": 1, "x": 2}', "{}", "[]"):
        r = call(bsrv, "PUT", path, admin, content=bad,
                 headers={"Content-Type": "application/json"})
        assert_problem(r, 422, "validation")
    assert view(bsrv, app)["cap"] == DEFAULT
    assert put_cap(bsrv, app, 0)["cap"] == 0.0 and put_cap(bsrv, app, None)["cap"] is None
