"""The privacy floor at the server's door (every entry point applies it): a task whose
parameters make payloads close to the raw text, or whose noise cannot be computed, is
refused with a 422 problem through a real `cloud-api serve`, and nothing is declared;
PRIVBERT_ALLOW_WEAK_PRIVACY accepts it (store level: the same function the route calls)."""

from __future__ import annotations

import httpx
import pytest

from cloud_api.errors import WeakPrivacy, problem_type
from cloud_api.store import tasks
from tests.cloud_api.conftest import ServerProcess, new_keys
from tests.cloud_api.store.conftest import ETA

PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def srv(tiny_home, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("floor")
    s = ServerProcess(tiny_home.root, tmp / "serve.log", new_keys(app=1), {
        "PRIVBERT_RATE_LIMIT_PER_KEY": "0", "PRIVBERT_WORKER_IN_SERVE": "0",
        "PRIVBERT_DATABASE_URL": f"sqlite:///{tmp / 'floor.db'}"})
    s.start()
    yield s
    s.stop()


def declare(srv, bundle, name: str, mechanism: str, params: dict) -> httpx.Response:
    return httpx.post(f"{srv.url}/admin/tasks", headers=srv.headers(srv.admin_key), timeout=60,
                      json={"task": name, "labels": ["neg", "pos"], "mechanism": mechanism,
                            "params": params, "bundle_id": bundle.bundle_id})


@pytest.mark.parametrize(("mechanism", "params", "kind", "needle"), [
    ("dchi-text", {"eta": 1e6}, "weak-privacy", "privacy floor"),
    ("dchi-embedding", {"eta": 1e308}, "weak-privacy", "privacy floor"),
    ("laplace", {"epsilon": 1e12}, "weak-privacy", "privacy floor"),
    ("ome", {"epsilon": 1.0, "lam": 1e9}, "weak-privacy", "privacy floor"),
    ("dchi-text", {"eta": 1e-40}, "validation", "eta=1e-40 is too small to compute"),
])
def test_weak_or_uncomputable_task_is_refused(srv, tiny_bundle_of_home, mechanism, params,
                                              kind, needle):
    name = f"weak-{mechanism}-{len(str(params))}"
    r = declare(srv, tiny_bundle_of_home, name, mechanism, params)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["type"] == problem_type(kind) and needle in body["detail"], body
    if kind == "weak-privacy":
        assert "PRIVBERT_ALLOW_WEAK_PRIVACY" in body["detail"]
    listed = httpx.get(f"{srv.url}/admin/tasks", headers=srv.headers(srv.admin_key)).json()
    assert name not in {t["task"] for t in listed["tasks"]}  # nothing declared


def test_parameters_above_the_floor_are_declared(srv, tiny_bundle_of_home):
    r = declare(srv, tiny_bundle_of_home, "fine", "dchi-text", {"eta": ETA})
    assert r.status_code == 201, r.text
    r = declare(srv, tiny_bundle_of_home, "fine-lap", "laplace", {"epsilon": 2})
    assert r.status_code == 201, r.text


def test_allow_weak_privacy_accepts_what_is_refused_otherwise(tiny_bundle_of_home):
    with pytest.raises(WeakPrivacy, match="privacy floor"):
        tasks.privacy_floor_refusal("dchi-text", {"eta": 1e6}, tiny_bundle_of_home, False)
    tasks.privacy_floor_refusal("dchi-text", {"eta": 1e6}, tiny_bundle_of_home, True)
    tasks.privacy_floor_refusal("dchi-text", {"eta": ETA}, tiny_bundle_of_home, False)
