"""Auth on every route of the OpenAPI document: none / wrong key 401, an application key on
/admin 403, an admin key everywhere, the probes open; keys are checked before the body."""

from __future__ import annotations

import httpx
import pytest

from cloud_api.errors import problem_type

OPEN = {"/healthz", "/readyz", "/metrics", "/docs", "/openapi.json"}


def operations(server) -> list[tuple[str, str]]:
    doc = httpx.get(f"{server.url}/openapi.json").json()
    return [(method.upper(), path) for path, item in doc["paths"].items() for method in item]


def concrete(path: str, bundle_id: str) -> str:
    return (path.replace("{model_id}", "text").replace("{bundle_id}", bundle_id)
            .replace("{task}", "text").replace("{job_id}", "1"))


def call(server, method: str, path: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    # a body that would fail validation: the key must be refused before it is read
    return httpx.request(method, f"{server.url}{path}", headers=headers,
                         content=b"{not json" if method in ("POST", "PUT", "PATCH") else None)


def test_every_route_needs_the_right_key(server, tiny_bundle_of_home):
    ops = operations(server)
    assert len(ops) >= 7
    checked = 0
    for method, template in ops:
        path = concrete(template, tiny_bundle_of_home.bundle_id)
        if template in OPEN:
            assert call(server, method, path, None).status_code == 200, template
            continue
        for key in (None, "wrong-key", server.admin_key[:-1]):
            r = call(server, method, path, key)
            assert r.status_code == 401, (method, template, key, r.text)
            assert r.json()["type"] == problem_type("unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
        app = call(server, method, path, server.app_key)
        admin = call(server, method, path, server.admin_key)
        if template.startswith("/admin/"):
            assert app.status_code == 403, (template, app.text)
            assert app.json()["type"] == problem_type("forbidden")
        else:
            assert app.status_code not in (401, 403), (template, app.text)
        assert admin.status_code not in (401, 403), (template, admin.text)
        checked += 1
    assert checked >= 4


@pytest.mark.parametrize("header", ["Basic abc", "Bearer", "bearer-x y", "", "Bearer a b"])
def test_malformed_authorization_headers_are_401(server, header):
    r = httpx.get(f"{server.url}/v1/models", headers={"Authorization": header})
    assert r.status_code == 401 and r.json()["type"] == problem_type("unauthorized")


def test_admin_key_promotes_and_app_key_cannot(server):
    url = f"{server.url}/admin/models/text/promote"
    current = server.model("text")["version"]
    r = httpx.post(url, json={"version": current}, headers=server.headers(server.app_key))
    assert r.status_code == 403
    r = httpx.post(url, json={"version": current}, headers=server.headers(server.admin_key))
    assert r.status_code == 200 and r.json() == {"model_id": "text", "version": current}
    r = httpx.post(url, json={"version": "v999"}, headers=server.headers(server.admin_key))
    assert r.status_code == 404 and r.json()["type"] == problem_type("not-found")
    r = httpx.post(url, json={"version": "latest"}, headers=server.headers(server.admin_key))
    assert r.status_code == 422 and r.json()["type"] == problem_type("validation")
