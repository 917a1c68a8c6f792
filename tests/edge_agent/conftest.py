"""Fixtures for the edge agent: bundles with a tiny ONNX sentence encoder, a fake server.

The encoder is a small random ``transformers.BertModel`` with mean pooling, exported
with ``torch.onnx.export`` to the input and output names of ``edge_agent/privatize/encoder.py``
(ARCHITECTURE.md "The edge bundle"). Tests may import torch; the ``edge_agent`` package
never does (the real export is ``models/export/writers.py``, ``cloud-api export-bundle``).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
# a TextHide key of 128 bits for tests (public, so it protects nothing)
TEXTHIDE_KEY = "3b9f0e6c2a7d48e1b05c9f13a6d27e84"


def build_encoder_onnx(vocab_size: int, hidden: int = 16, max_length: int = 64,
                       seed: int = 0) -> bytes:
    """ONNX bytes of a random 1-layer BERT + mean pooling over the attention mask."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=2 * hidden,
                     max_position_embeddings=max_length, type_vocab_size=2)
    bert = BertModel(cfg).eval()

    class MeanPooled(torch.nn.Module):
        def __init__(self, b):
            super().__init__()
            self.b = b

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.b(input_ids=input_ids, attention_mask=attention_mask,
                       token_type_ids=token_type_ids).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            return (h * m).sum(1) / m.sum(1).clamp(min=1e-9)

    example = (torch.tensor([[2, 5, 6, 3], [2, 7, 3, 0]]),
               torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
               torch.zeros(2, 4, dtype=torch.long))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(MeanPooled(bert).eval(), example, buf, input_names=INPUTS,
                          output_names=["sentence_embedding"], opset_version=17, dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in INPUTS})
    return buf.getvalue()


def with_tiny_encoder(bundle, hidden: int = 16):
    """``bundle`` plus a tiny random encoder (vocabulary of the bundle, output ``hidden``)."""
    max_length = min(bundle.max_length, 128)
    data = build_encoder_onnx(bundle.vocab_size, hidden, max_length)
    return bundle.with_encoder(data, {"pooling": "mean", "output_dim": hidden,
                                      "max_length": max_length, "inputs": INPUTS,
                                      "output": "sentence_embedding", "opset": 17})


@pytest.fixture(scope="session")
def minilm_enc_bundle(minilm_bundle):
    return with_tiny_encoder(minilm_bundle)


@pytest.fixture(scope="session")
def minilm_enc_dir(minilm_enc_bundle, tmp_path_factory) -> Path:
    return minilm_enc_bundle.save(tmp_path_factory.mktemp("minilm-enc-bundle"))


def run_cli(*args: str, stdin: bytes | None = None, env: dict | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m edge_agent ARGS`` in a subprocess (bytes in, text out)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("EDGE_AGENT_DEBUG", "PRIVBERT_TEXTHIDE_KEY", "PRIVBERT_TEXTHIDE_SEED")}
    full_env = {**base, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "edge_agent", *args], input=stdin,
                          capture_output=True, cwd=REPO, env=full_env, timeout=timeout)
    proc.stdout = proc.stdout.decode("utf-8")
    proc.stderr = proc.stderr.decode("utf-8")
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int | None = None,
                          contains: str = "") -> str:
    """Non-zero exit, no traceback, exactly one ``edge-agent: error:`` line on stderr."""
    assert proc.returncode != 0, proc.stderr
    if code is not None:
        assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("edge-agent: error:")]
    others = [ln for ln in proc.stderr.splitlines()
              if ln.strip() and not ln.startswith("edge-agent: warning:")]
    assert len(errors) == 1 and others == errors, proc.stderr
    assert contains.lower() in errors[0].lower(), errors[0]
    return errors[0]


class FakeServer:
    """A tiny HTTP server for the CLI: routes -> (status, headers, body) or a callable.
    Records every request (method, path, headers, body)."""

    def __init__(self):
        self.routes: dict[tuple[str, str], object] = {}
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _serve(self, method: str):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                req = {"method": method, "path": self.path, "headers": dict(self.headers),
                       "body": body}
                outer.requests.append(req)
                route = outer.routes.get((method, self.path))
                if route is None:
                    status, headers, out = 404, {"Content-Type": "application/problem+json"}, \
                        json.dumps({"type": "about:blank", "title": "Not Found",
                                    "detail": f"no route {self.path}"}).encode()
                elif callable(route):
                    status, headers, out = route(req)
                else:
                    status, headers, out = route
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def json_route(self, method: str, path: str, obj, status: int = 200) -> None:
        self.routes[(method, path)] = (status, {"Content-Type": "application/json"},
                                       json.dumps(obj).encode())

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_server():
    server = FakeServer()
    yield server
    server.close()
