"""The service and browsers, against a real `cloud-api serve`: CORS on /v1 only (predictions
included), by setting, none by default, a refused preflight logged; /demo off unless enabled,
served with a strict Content-Security-Policy, its key handed out only when set, never an
admin key; its content-named assets immutable and sent precompressed; the bundle gzip, with
its length before compression; a clear refusal to start when the page is not built."""

from __future__ import annotations

import gzip
import io
import tarfile

import httpx
import pytest

from tests.cloud_api.conftest import (
    ServerProcess,
    body_of,
    cloud_api,
    new_keys,
    onnx_home,
    payloads_for,
)

ORIGIN = "https://app.example.test"
OTHER = "https://evil.example.test"
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def page_dir(tmp_path_factory):
    """A stand-in for the built page (the browser test serves the real build)."""
    d = tmp_path_factory.mktemp("dist")
    (d / "index.html").write_text("<!doctype html><title>explorer</title>")
    (d / "assets").mkdir()
    (d / "assets" / "page.js").write_text("export {};\n")
    (d / "assets" / "ort.wasm").write_bytes(b"\0asm\1\0\0\0")
    # what the page's build writes beside a file (web_edge/demo/vite.config.ts)
    (d / "assets" / "ort.wasm.br").write_bytes(b"brotli copy of ort.wasm")
    (d / "index.html.br").write_bytes(b"brotli copy of index.html")
    (d / "assets" / "ort.wasm.gz").write_bytes(gzip.compress(b"\0asm\1\0\0\0", mtime=0))
    return d


@pytest.fixture(scope="module")
def web_server(tiny_home, tmp_path_factory, page_dir):
    """A server with CORS for ORIGIN and /demo with a demo key (the session's ``server`` has
    the defaults: neither)."""
    root = tmp_path_factory.mktemp("web")
    home, _ = onnx_home(tiny_home, root / "home")
    keys = new_keys()
    demo_key = "demo-key-for-this-test-only"
    on = ServerProcess(home.root, root / "on.log", keys, {
        "PRIVBERT_CORS_ORIGINS": f"{ORIGIN}, http://127.0.0.1:9",
        "PRIVBERT_DEMO": "1", "PRIVBERT_DEMO_DIR": str(page_dir),
        "PRIVBERT_DEMO_KEY": demo_key, "PRIVBERT_WORKER_IN_SERVE": "0",
        "PRIVBERT_BACKEND": "onnx", "PRIVBERT_RATE_LIMIT_PER_KEY": "0",
        "PRIVBERT_DEFAULT_BUDGET": "1e9"})
    try:
        on.start()
        on.demo_key = demo_key
        yield on
    finally:
        on.stop()


def predict_body(server, bundle) -> bytes:
    model = server.model("text")
    return body_of(payloads_for(model, ["a good fun movie"], bundle)).encode()


def test_predict_answers_cors_preflight_and_exposes_headers(web_server,
                                                           tiny_bundle_of_home):
    on = web_server
    url = f"{on.url}/v1/models/text/predict"
    pre = httpx.options(url, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-device-id"})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in pre.headers["access-control-allow-methods"]
    allowed = pre.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    assert "access-control-allow-credentials" not in pre.headers  # bearer keys, no cookies

    r = httpx.post(url, content=predict_body(on, tiny_bundle_of_home), headers={
        **on.headers(), "Origin": ORIGIN, "Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == ORIGIN
    exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    assert {"x-privacy-budget-remaining", "retry-after", "x-request-id"} <= exposed
    assert "x-privacy-budget-remaining" in r.headers and "x-request-id" in r.headers


def test_problems_carry_cors_headers_so_a_page_can_read_them(web_server):
    on = web_server
    r = httpx.post(f"{on.url}/v1/models/text/predict", content=b"{}",
                   headers={"Origin": ORIGIN, "Content-Type": "application/json"})
    assert r.status_code == 401 and r.headers["content-type"] == PROBLEM
    assert r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.get(f"{on.url}/v1/models", headers={**on.headers(), "Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


def test_an_origin_not_listed_gets_no_cors_and_its_preflight_is_a_problem(web_server):
    on = web_server
    pre = httpx.options(f"{on.url}/v1/models", headers={
        "Origin": OTHER, "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization"})
    assert pre.status_code == 400 and pre.headers["content-type"] == PROBLEM
    body = pre.json()
    assert body["type"] == "urn:privbert:problem:cors-refused" and "origin" in body["detail"]
    assert "access-control-allow-origin" not in pre.headers
    r = httpx.get(f"{on.url}/v1/models", headers={**on.headers(), "Origin": OTHER})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    # a header the service does not take is refused as well
    pre = httpx.options(f"{on.url}/v1/models", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "x-raw-text"})
    assert pre.status_code == 400 and "headers" in pre.json()["detail"]


@pytest.mark.parametrize("path", ["/admin/tasks", "/admin/budgets", "/healthz", "/demo/"])
def test_no_cors_outside_v1(web_server, path):
    on = web_server
    pre = httpx.options(f"{on.url}{path}", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "authorization"})
    assert "access-control-allow-origin" not in pre.headers
    assert pre.status_code in (400, 405), pre.text  # never a granted preflight
    r = httpx.get(f"{on.url}{path}", headers={**on.headers(on.admin_key), "Origin": ORIGIN})
    assert "access-control-allow-origin" not in r.headers


def test_cors_and_demo_are_off_by_default(server):
    off = server  # the session's server: started with the defaults
    pre = httpx.options(f"{off.url}/v1/models/text/predict", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 405 and "access-control-allow-origin" not in pre.headers
    r = httpx.get(f"{off.url}/v1/models", headers={**off.headers(), "Origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    assert httpx.get(f"{off.url}/demo/").status_code == 404
    assert httpx.get(f"{off.url}/demo/config.json").status_code == 404


def test_demo_page_is_served_under_a_strict_csp(web_server):
    on = web_server
    r = httpx.get(f"{on.url}/demo", follow_redirects=True)
    assert r.status_code == 200 and "<title>explorer" in r.text
    csp = dict(d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";"))
    assert csp["default-src"] == "'none'"
    assert csp["script-src"] == "'self' 'wasm-unsafe-eval'"  # no inline script, no eval
    assert csp["connect-src"] == "'self'" and csp["frame-ancestors"] == "'none'"
    assert r.headers["cross-origin-opener-policy"] == "same-origin"
    assert r.headers["cross-origin-embedder-policy"] == "require-corp"
    wasm = httpx.get(f"{on.url}/demo/assets/ort.wasm")
    assert wasm.headers["content-type"] == "application/wasm"
    js = httpx.get(f"{on.url}/demo/assets/page.js")
    assert js.headers["content-type"].startswith("text/javascript")
    assert httpx.get(f"{on.url}/demo/assets/nope.js").status_code == 404
    # the access log names the route, never the path
    on.wait_log(lambda ln: ln.get("route") == "/demo/{path}" and ln.get("status") == 404)
    lines = [ln for ln in on.log_lines() if ln.get("message") == "request"]
    demo = [ln for ln in lines if ln.get("route") == "/demo/{path}"]
    assert demo and not any("page.js" in str(ln) or "ort.wasm" in str(ln) for ln in lines)


def test_demo_config_hands_out_the_demo_key_which_is_an_app_key_only(web_server):
    on = web_server
    r = httpx.get(f"{on.url}/demo/config.json")
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    cfg = r.json()
    assert cfg == {"api_key": on.demo_key}
    demo = {"Authorization": f"Bearer {on.demo_key}"}
    assert httpx.get(f"{on.url}/v1/models", headers=demo).status_code == 200
    r = httpx.get(f"{on.url}/admin/budgets", headers=demo)
    assert r.status_code == 403 and r.headers["content-type"] == PROBLEM


def _serve_refusal(tmp_path, env: dict, keys: dict | None = None) -> str:
    """`cloud-api serve` that must refuse to start: its one line (exit code 2)."""
    keys = keys or new_keys()
    r = cloud_api("serve", "--port", "0", env={
        "PRIVBERT_HOME": str(tmp_path / "home"), "PRIVBERT_API_KEYS": keys["app"][0],
        "PRIVBERT_ADMIN_KEYS": keys["admin"][0], **env}, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cloud-api: error: "), r.stderr
    return lines[0]


def test_serve_refuses_an_unbuilt_demo_an_admin_demo_key_and_a_bad_origin(tmp_path):
    line = _serve_refusal(tmp_path, {"PRIVBERT_DEMO": "1",
                                     "PRIVBERT_DEMO_DIR": str(tmp_path / "missing")})
    assert "demo page is not built" in line and "scripts/build_web.sh" in line
    (tmp_path / "index.html").write_text("built")
    keys = new_keys()
    line = _serve_refusal(tmp_path, {"PRIVBERT_DEMO": "1", "PRIVBERT_DEMO_DIR": str(tmp_path),
                                     "PRIVBERT_DEMO_KEY": keys["admin"][0]}, keys)
    assert "PRIVBERT_DEMO_KEY is an admin key" in line
    line = _serve_refusal(tmp_path, {"PRIVBERT_CORS_ORIGINS": "https://app.test/path"})
    assert "PRIVBERT_CORS_ORIGINS" in line and "not an origin" in line


def test_a_refused_preflight_is_logged_with_origin_method_and_headers(web_server):
    on = web_server
    pre = httpx.options(f"{on.url}/v1/models/text/predict", headers={
        "Origin": OTHER, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 400
    refused = on.wait_log(lambda ln: ln.get("message", "").startswith("CORS preflight"))
    last = refused[-1]
    assert last["level"] == "WARNING" and last["origin"] == OTHER and last["method"] == "POST"
    assert last["headers"] == "authorization, content-type" and "origin" in last["refused"]


def raw(url: str, headers: dict) -> tuple[httpx.Response, bytes]:
    """The answer and its bytes as they came over the wire (not decoded)."""
    with httpx.stream("GET", url, headers=headers) as r:
        return r, b"".join(r.iter_raw())


def test_demo_assets_are_immutable_and_sent_precompressed(web_server, page_dir):
    on = web_server
    url = f"{on.url}/demo/assets/ort.wasm"
    r, body = raw(url, {"Accept-Encoding": "gzip, br"})
    assert r.status_code == 200 and r.headers["content-encoding"] == "br"
    assert body == (page_dir / "assets" / "ort.wasm.br").read_bytes()
    assert r.headers["content-type"] == "application/wasm" and r.headers["vary"] == "Accept-Encoding"
    assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
    r, body = raw(url, {"Accept-Encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip" and gzip.decompress(body) == b"\0asm\1\0\0\0"
    r, body = raw(url, {"Accept-Encoding": "identity"})
    assert "content-encoding" not in r.headers and body == b"\0asm\1\0\0\0"
    assert r.headers["vary"] == "Accept-Encoding"
    again = httpx.get(url, headers={"Accept-Encoding": "br", "If-None-Match": r.headers["etag"]})
    assert again.status_code == 200  # the identity file's ETag is not the br copy's
    r, _ = raw(url, {"Accept-Encoding": "br"})
    same = httpx.get(url, headers={"Accept-Encoding": "br", "If-None-Match": r.headers["etag"]})
    assert same.status_code == 304
    # the page itself is revalidated (and precompressed too); a missing asset is never kept
    page = httpx.get(f"{on.url}/demo/", headers={"Accept-Encoding": "gzip"})
    assert page.headers["cache-control"] == "no-cache" and "<title>explorer" in page.text
    r, body = raw(f"{on.url}/demo/", {"Accept-Encoding": "br"})
    assert body == b"brotli copy of index.html" and r.headers["content-type"].startswith("text/html")
    missing = httpx.get(f"{on.url}/demo/assets/nope.js")
    assert missing.status_code == 404 and "immutable" not in missing.headers.get("cache-control", "")


def test_the_bundle_is_sent_gzip_with_its_length_before_compression(web_server,
                                                                    tiny_bundle_of_home):
    on = web_server
    url = f"{on.url}/v1/bundles/{tiny_bundle_of_home.bundle_id}"
    r, body = raw(url, {**on.headers(), "Accept-Encoding": "gzip", "Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["content-encoding"] == "gzip", r.headers
    tar = gzip.decompress(body)
    assert int(r.headers["x-bundle-bytes"]) == len(tar) > len(body)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        assert "bundle.json" in {m.name.split("/")[-1] for m in t.getmembers()}
    assert r.headers["cache-control"] == "private, max-age=31536000, immutable"
    assert "Accept-Encoding" in r.headers["vary"]  # and Origin: CORS adds it
    exposed = {h.strip().lower() for h in r.headers["access-control-expose-headers"].split(",")}
    assert "x-bundle-bytes" in exposed  # a page's download progress reads it
    plain, body = raw(url, {**on.headers(), "Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and body == tar
    assert int(plain.headers["content-length"]) == len(tar)
