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


# -- keys read one way (issue 34, finding 3) ---------------------------------------------------
SPELLINGS = ["{k} ", " {k}", "{k}\t", "{k}\n", "\u00a0{k}\r\n"]  # a .env line, a paste, ...


def test_a_bearer_token_is_read_as_the_keys_are(server):
    """Surrounding whitespace is no part of a key, in a header as in the settings."""
    r = httpx.get(f"{server.url}/admin/budgets",
                  headers={"Authorization": f"Bearer   {server.admin_key}"})
    assert r.status_code == 200, r.text
    r = httpx.get(f"{server.url}/admin/budgets",
                  headers={"Authorization": f"Bearer  {server.app_key}"})
    assert r.status_code == 403 and r.json()["type"] == problem_type("forbidden")


def test_the_demo_key_is_never_an_admin_key_by_any_spelling(tmp_path, monkeypatch):
    """The finding: an admin key plus a trailing space as PRIVBERT_DEMO_KEY was handed out by
    /demo/config.json and passed the admin checks. `cloud-api serve` now refuses to start,
    in one line; and so does the key ring it builds (cloud_api.auth, read from the
    environment as serve reads it) for every spelling, with the admin key from each source:
    PRIVBERT_ADMIN_KEYS, a keys-file line, a keys-file sha256 line. The key handed to the page
    is the normalized one; a key that normalizes to no visible-ASCII key is refused."""
    import hashlib

    from cloud_api.auth import KeyRing
    from cloud_api.settings import Settings, settings_error
    from tests.cloud_api.conftest import cloud_api, new_keys

    keys = new_keys()
    admin, app = keys["admin"][0], keys["app"][0]
    page = tmp_path / "dist"
    page.mkdir()
    (page / "index.html").write_text("<!doctype html>")
    r = cloud_api("serve", "--port", "0", env={
        "PRIVBERT_HOME": str(tmp_path / "home"), "PRIVBERT_API_KEYS": app,
        "PRIVBERT_ADMIN_KEYS": admin, "PRIVBERT_DEMO": "1", "PRIVBERT_DEMO_DIR": str(page),
        "PRIVBERT_DEMO_KEY": admin + " "}, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "PRIVBERT_DEMO_KEY is an admin key" in lines[0] and admin not in lines[0]

    keys_file = tmp_path / "keys"
    sources = {
        "env": {"PRIVBERT_ADMIN_KEYS": f" {admin} "},
        "file": {"PRIVBERT_KEYS_FILE": str(keys_file), "_file": f"admin {admin}  # ops\n"},
        "sha256": {"PRIVBERT_KEYS_FILE": str(keys_file), "_file": "admin sha256:"
                   + hashlib.sha256(admin.encode()).hexdigest() + "\n"},
    }
    refused = 0
    for env in sources.values():
        for spelling in SPELLINGS:
            for k in ("PRIVBERT_ADMIN_KEYS", "PRIVBERT_KEYS_FILE"):
                monkeypatch.delenv(k, raising=False)
            keys_file.write_text(env.get("_file", ""))
            for k, v in env.items():
                if not k.startswith("_"):
                    monkeypatch.setenv(k, v)
            monkeypatch.setenv("PRIVBERT_API_KEYS", app)
            monkeypatch.setenv("PRIVBERT_DEMO", "1")
            monkeypatch.setenv("PRIVBERT_DEMO_KEY", spelling.format(k=admin))
            settings = Settings()
            assert settings.demo_key.get_secret_value() == admin  # what /demo would hand out
            with pytest.raises(ValueError, match="PRIVBERT_DEMO_KEY is an admin key"):
                KeyRing.from_settings(settings)
            refused += 1
    # an application key as the demo key, spelled with spaces: the page gets it normalized
    monkeypatch.setenv("PRIVBERT_DEMO_KEY", f"\t{app} \n")
    ring = KeyRing.from_settings(Settings())
    assert ring.verify(app).role == "app" and ring.verify(admin).role == "admin"
    assert Settings().demo_key.get_secret_value() == app
    for bad in (f"{admin[:4]} {admin[4:]}", f"{admin}\u200b", "é" + admin):
        monkeypatch.setenv("PRIVBERT_DEMO_KEY", bad)
        with pytest.raises(ValueError) as exc:
            Settings()
        line = settings_error(exc.value)
        assert "PRIVBERT_DEMO_KEY" in line and "visible ASCII" in line and admin[4:] not in line
    print(f"\ndemo key: {refused} spellings of an admin key over 3 sources refused "
          f"(and `cloud-api serve` exit {r.returncode})")
