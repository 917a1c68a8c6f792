"""Graceful shutdown of a real `cloud-api serve`: requests in flight when SIGTERM arrives
(their bodies still arriving) are all answered, then the batch queues drain, the models are
released and the process ends (uvicorn re-raises SIGTERM after its clean shutdown)."""

from __future__ import annotations

import json
import signal
import socket
import time
from urllib.parse import urlsplit

from tests.cloud_api.conftest import ServerProcess, body_of, new_keys, payloads_for
from tests.cloud_api.test_http_limits import _read_response


def _wait_for_log(srv: ServerProcess, message: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not any(message in str(ln.get("message")) for ln in srv.log_lines()):
        assert time.monotonic() < deadline, f"no log line {message!r}:\n{srv.log_tail()}"
        time.sleep(0.05)


def test_sigterm_finishes_requests_in_flight_then_stops(tiny_home, tiny_bundle_of_home,
                                                          tmp_path):
    srv = ServerProcess(tiny_home.root, tmp_path / "serve.log", new_keys(),
                        {"PRIVBERT_RATE_LIMIT_PER_KEY": "0"}).start()
    held: list[socket.socket] = []
    try:
        body = body_of(payloads_for(srv.model("text"), ["a good film", "dull"],
                                    tiny_bundle_of_home)).encode()
        u = urlsplit(srv.url)
        for _ in range(3):  # each request is in flight: headers and half of the body sent
            s = socket.create_connection((u.hostname, u.port), timeout=30)
            s.sendall(f"POST /v1/models/text/predict HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {srv.app_key}\r\nContent-Type: application/json"
                      f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body[:40])
            held.append(s)
        deadline = time.monotonic() + 20
        while srv.metric("privbert_requests_in_flight") < 4:  # 3 held + this /metrics
            assert time.monotonic() < deadline, "the requests never got in flight"
            time.sleep(0.05)
        srv.proc.send_signal(signal.SIGTERM)
        _wait_for_log(srv, "Shutting down")  # uvicorn stopped accepting
        for s in held:
            s.sendall(body[40:])
        for s in held:
            status, _, answer = _read_response(s)
            s.close()  # an idle keep-alive connection would hold the shutdown
            assert status == 200, answer
            assert len(json.loads(answer)["predictions"]) == 2
        # uvicorn re-raises the signal once it has shut down cleanly
        assert srv.proc.wait(30) in (0, -signal.SIGTERM)
        messages = [str(ln.get("message")) for ln in srv.log_lines()]
        assert "shutting down: draining batch queues" in messages
        assert any(m.startswith("released model text") for m in messages)
    finally:
        for s in held:
            s.close()
        srv.stop()
