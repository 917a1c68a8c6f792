"""Each limit on a real server with small settings (``TIGHT`` in conftest): body size (413
before the body is read, Content-Length or chunked), payloads per request (413), tokens per
payload (422), concurrent requests (429 with Retry-After), the per-key rate (429 with
Retry-After)."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httpx
import numpy as np

from cloud_api.errors import problem_type
from shared.payload import make_payload

LIMIT = 4096


def _sock(server) -> socket.socket:
    u = urlsplit(server.url)
    s = socket.create_connection((u.hostname, u.port), timeout=20)
    return s


def _head(server, key: str, extra: str) -> bytes:
    return (f"POST /v1/models/text/predict HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n{extra}\r\n"
            ).encode()


def _read_response(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
    n = int(headers.get("content-length", 0))
    while len(rest) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest


def test_content_length_over_the_limit_is_413_before_the_body(tight_server):
    key = tight_server.keys["app"][0]
    with _sock(tight_server) as s:
        s.sendall(_head(tight_server, key, "Content-Length: 50000000\r\n"))  # no body at all
        status, headers, body = _read_response(s)
    assert status == 413 and b"too-large" in body and headers["connection"] == "close"
    assert headers["content-type"] == "application/problem+json"


def test_chunked_body_is_cut_at_the_limit_without_reading_the_rest(tight_server):
    key = tight_server.keys["app"][1]
    with _sock(tight_server) as s:
        s.sendall(_head(tight_server, key, "Transfer-Encoding: chunked\r\n"))
        for _ in range(3):  # 3 x 2000 bytes > 4096; the final 0-chunk is never sent
            s.sendall(b"7d0\r\n" + b" " * 2000 + b"\r\n")
        status, headers, body = _read_response(s)
    assert status == 413, body
    assert problem_type("too-large").encode() in body


def _payload(bundle_id: str, n_tokens: int) -> dict:
    ids = np.arange(10, 10 + n_tokens) % 30 + 10
    return make_payload("dchi-text", {"eta": 5.0}, bundle_id, ids).model_dump(mode="json")


def test_payload_count_and_tokens_per_payload(tight_server, tiny_bundle_of_home):
    url = f"{tight_server.url}/v1/models/text/predict"
    headers = tight_server.headers(tight_server.keys["app"][2])
    bid = tiny_bundle_of_home.bundle_id
    ok = httpx.post(url, json={"payloads": [_payload(bid, 8)] * 4}, headers=headers)
    assert ok.status_code == 200, ok.text
    many = httpx.post(url, json={"payloads": [_payload(bid, 2)] * 5}, headers=headers)
    assert many.status_code == 413 and many.json()["type"] == problem_type("too-many-payloads")
    assert "at most 4" in many.json()["detail"]
    long = httpx.post(url, json={"payloads": [_payload(bid, 9)]},
                      headers=tight_server.headers(tight_server.keys["app"][3]))
    assert long.status_code == 422 and "tokens" in long.json()["detail"], long.text


def test_concurrency_limit_is_429_with_retry_after(tight_server):
    """Two requests held in flight (their bodies never finish) fill the limit of 2."""
    held = []
    try:
        for key in tight_server.keys["app"][4:6]:
            s = _sock(tight_server)
            s.sendall(_head(tight_server, key, "Content-Length: 100\r\n") + b'{"payl')
            held.append(s)
        deadline = time.monotonic() + 20
        while tight_server.metric("privbert_requests_in_flight") < 3:  # 2 held + /metrics
            assert time.monotonic() < deadline, "held requests never got in flight"
            time.sleep(0.05)
        r = httpx.get(f"{tight_server.url}/v1/models",
                      headers=tight_server.headers(tight_server.keys["app"][6]))
        assert r.status_code == 429 and r.json()["type"] == problem_type("overloaded")
        assert int(r.headers["retry-after"]) >= 1
        assert httpx.get(f"{tight_server.url}/healthz").status_code == 200  # probes answer
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 20
    while True:  # the held requests end when their clients go away
        r = httpx.get(f"{tight_server.url}/v1/models",
                      headers=tight_server.headers(tight_server.keys["app"][6]))
        if r.status_code == 200:
            break
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)


def test_rate_limit_per_key_is_429_with_retry_after(tight_server):
    """0.2 requests/s with a burst of 2: the third request of a key in a row waits ~5 s;
    another key is not affected."""
    key, other = tight_server.keys["app"][7], tight_server.admin_key
    got = [httpx.get(f"{tight_server.url}/v1/models", headers=tight_server.headers(key))
           for _ in range(3)]
    assert [r.status_code for r in got[:2]] == [200, 200]
    assert got[2].status_code == 429, got[2].text
    assert got[2].json()["type"] == problem_type("rate-limited")
    assert 1 <= int(got[2].headers["retry-after"]) <= 5
    assert httpx.get(f"{tight_server.url}/v1/models",
                     headers=tight_server.headers(other)).status_code == 200
