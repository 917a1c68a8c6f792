"""Fixtures for the HTTP service: a home with tiny bootstrapped models and real `cloud-api
serve` processes on free loopback ports.

* ``tiny_home`` (session): ``cloud-api bootstrap`` run twice on a tiny random BERT and a few
  dozen synthetic rows: model ``text`` (dchi-text) and model ``emb`` (dchi-embedding), both
  η = 5 (above the tiny table's privacy floor), each promoted as v1. ``text`` is bootstrapped
  with PRIVBERT_BACKEND=onnx, so its v1 also has ``classifier.onnx``.
* ``server`` (session): ``cloud-api serve`` on that home with generous limits and no rate
  limit, and a default privacy budget cap for new keys; its JSON log goes to a file (the
  tripwire reads it).
* ``tight_server`` (session): a second replica on the same home with small limits (body,
  payloads, tokens, concurrency, rate), one application key per test that needs its own
  rate bucket.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO

# readiness: only catches hangs (two session servers loading torch models took 97 s to be
# ready at load 9 on 2 cores; 90 s failed the session fixture)
TIMEOUT = 300.0
ETA = 5.0  # the tiny table's floor starts at about eta = 13
EMB_MAX_LENGTH = 16  # the emb model reads fewer tokens than its bundle allows
DEFAULT_BUDGET = 1e9  # PRIVBERT_DEFAULT_BUDGET of the main test server


def cli_env(extra: dict | None = None) -> dict:
    """The environment of a `cloud-api` / `edge-agent` subprocess: no PRIVBERT_* leaking in
    from the shell (but the test's own device ledger and the tiny bundles the suite trusts,
    tests/conftest.py), one torch thread
    (2 shared cores), this checkout on the path."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PRIVBERT_") or k in ("PRIVBERT_LEDGER", "PRIVBERT_TRUSTED_BUNDLES")}
    env.update({"PYTHONPATH": str(REPO), "PRIVBERT_TORCH_THREADS": "1",
                "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.update(extra or {})
    return env


def cloud_api(*args: str, env: dict | None = None, timeout: float = 180
              ) -> subprocess.CompletedProcess:
    """``python -m cloud_api.cli ARGS`` (text out)."""
    return subprocess.run([sys.executable, "-m", "cloud_api.cli", *args], cwd=REPO,
                          env=cli_env(env), capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TinyHome:
    root: Path
    base: Path          # the tiny BERT folder (--base)
    data: Path          # train.tsv
    dev: Path           # dev.tsv
    bootstrap_out: dict[str, str] = field(default_factory=dict)  # model id -> stdout
    # model id -> promoted version once the fixture is built (tests promote more later)
    promoted_at_start: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="session")
def tiny_home(tmp_path_factory) -> TinyHome:
    """``text`` by the real `cloud-api bootstrap` (a subprocess); meanwhile ``emb`` trained in
    this process with the same library calls and registered the same way (a second
    bootstrap process would cost another torch start on 2 shared cores)."""
    from tests.models.conftest import make_full_tiny_bert, sentiment_texts

    root = tmp_path_factory.mktemp("cloud")
    base = make_full_tiny_bert(root / "tiny-bert")
    files = {}
    for name, n, seed in (("train", 40, 0), ("dev", 16, 1)):
        texts, _, labels = sentiment_texts(n, seed)
        files[name] = root / f"{name}.tsv"
        files[name].write_text("sentence\tlabel\n" + "".join(
            f"{t}\t{y}\n" for t, y in zip(texts, labels, strict=True)))
    home = TinyHome(root / "home", base, files["train"], files["dev"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloud_api.cli", "bootstrap", "--data", str(home.data),
         "--dev", str(home.dev), "--mechanism", "dchi-text", "--eta", str(ETA),
         "--epochs", "1", "--limit", "32", "--base", str(base), "--model-id", "text", "--home", str(home.root),
         "--device", "cpu", "--no-progress"],
        cwd=REPO, env=cli_env({"PRIVBERT_BACKEND": "onnx"}), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        _train_in_process(home, "emb", "dchi-embedding")
    finally:
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"bootstrap failed:\n{err[-3000:]}"
    home.bootstrap_out["text"] = out + err
    from cloud_api.home import ModelHome

    home.promoted_at_start = ModelHome(home.root).promoted_all()
    return home


def _train_in_process(home: TinyHome, model_id: str, mechanism: str) -> None:
    from cloud_api.home import ModelHome
    from models.training.experiment import train_from_tsv
    from models.training.finetune import TrainConfig

    models = ModelHome(home.root).ensure()
    out = home.root.parent / f"trained-{model_id}"
    train_from_tsv(home.data, out, mechanism, {"eta": ETA}, dev_tsv=home.dev, base=home.base,
                   cfg=TrainConfig(epochs=1, device="cpu", progress=False,
                                   max_length=EMB_MAX_LENGTH))
    version = models.register(model_id, out, move=True)
    models.promote(model_id, version)


class ServerProcess:
    """A `cloud-api serve` subprocess on a free loopback port, its log in a file."""

    def __init__(self, home: Path, log: Path, keys: dict[str, list[str]],
                 env: dict | None = None, serve_args: tuple[str, ...] = ()):
        self.home, self.log, self.keys, self.serve_args = home, log, keys, serve_args
        self.env = {"PRIVBERT_HOME": str(home), "PRIVBERT_API_KEYS": ",".join(keys["app"]),
                    "PRIVBERT_ADMIN_KEYS": ",".join(keys["admin"]),
                    "PRIVBERT_RELOAD_INTERVAL_S": "0.2", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.url = ""

    @property
    def app_key(self) -> str:
        return self.keys["app"][0]

    @property
    def admin_key(self) -> str:
        return self.keys["admin"][0]

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.app_key}"}

    def launch(self) -> ServerProcess:
        """Start the process (returns at once; :meth:`start` also waits for /readyz)."""
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cloud_api.cli", "serve", "--host", "127.0.0.1",
                 "--port", str(port), "--graceful-timeout", "20", *self.serve_args],
                cwd=REPO, env=cli_env(self.env), stdout=fh, stderr=subprocess.STDOUT)
        return self

    def start(self) -> ServerProcess:
        if self.proc is None:
            self.launch()
        for _ in range(3):  # a port taken between free_port() and bind: try another
            if self.wait_ready():
                return self
            self.launch()
        raise RuntimeError(f"cloud-api serve did not start:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = TIMEOUT) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"cloud-api serve not ready in {timeout} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 30) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def log_lines(self) -> list[dict]:
        """The JSON log lines written so far (every line must be JSON)."""
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def wait_log(self, match, seconds: float = 10.0) -> list[dict]:
        """The log lines ``match`` accepts, once there is one: a request's access line is
        written after its answer is sent, so a client can read the log before it lands."""
        deadline = time.monotonic() + seconds
        while not (found := [ln for ln in self.log_lines() if match(ln)]):
            assert time.monotonic() < deadline, f"no such log line in {seconds} s:\n{self.log_tail()}"
            time.sleep(0.05)
        return found

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text()[-n:] if self.log.exists() else ""

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of ``/metrics`` (0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return 0.0

    def model(self, model_id: str) -> dict:
        r = httpx.get(f"{self.url}/v1/models", headers=self.headers(), timeout=10)
        r.raise_for_status()
        return next(m for m in r.json()["models"] if m["id"] == model_id)


def onnx_home(tiny_home, root):
    """A home serving only ``text`` at its bootstrapped v1, with the bundle and the task."""
    from cloud_api.home import ModelHome
    from cloud_api.serving.bundles import BundleStore
    from cloud_api.store.db import Database
    from cloud_api.store.tasks import ensure_task
    from shared.bundle import EdgeBundle

    src = ModelHome(tiny_home.root)
    v1 = tiny_home.promoted_at_start["text"]
    config = src.read_config("text", v1)
    assert (src.version_dir("text", v1) / "classifier.onnx").is_file()
    home = ModelHome(root).ensure()
    copy = root.parent / "text-v1"
    shutil.copytree(src.version_dir("text", v1), copy)
    home.promote("text", home.register("text", copy, move=True))
    bundle = EdgeBundle.from_model(tiny_home.base)
    assert bundle.bundle_id == config["bundle_id"]
    BundleStore(home).add(bundle)
    db = Database(f"sqlite:///{root / 'privbert.db'}")
    try:
        db.upgrade()
        ensure_task(db, "text", config["labels"], config["mechanism"], config["params"],
                    config["bundle_id"])
    finally:
        db.dispose()
    return home, bundle


def new_keys(app: int = 1, admin: int = 1) -> dict[str, list[str]]:
    return {"app": [f"app-{secrets.token_hex(16)}" for _ in range(app)],
            "admin": [f"adm-{secrets.token_hex(16)}" for _ in range(admin)]}


TIGHT = {"PRIVBERT_MAX_BODY_BYTES": "4096", "PRIVBERT_MAX_PAYLOADS_PER_REQUEST": "4",
         "PRIVBERT_MAX_TOKENS_PER_PAYLOAD": "8", "PRIVBERT_MAX_CONCURRENT_REQUESTS": "2",
         "PRIVBERT_RATE_LIMIT_PER_KEY": "0.2", "PRIVBERT_RATE_LIMIT_BURST": "2"}


@pytest.fixture(scope="session")
def servers(tiny_home, tmp_path_factory):
    """Both replicas, started side by side (model loading overlaps)."""
    logs = tmp_path_factory.mktemp("logs")
    # (jobs) no job worker thread: generated POST /admin/pretrain bodies are valid jobs, and
    # these replicas share the home; the job tests start their own servers and workers
    no_worker = {"PRIVBERT_WORKER_IN_SERVE": "0"}
    # (budgets) app keys 1-3 are the privacy budget tests' own, with a default cap; key 4
    # is for tests that lift its cap (a send without an epsilon, texthide, fits no cap)
    main = ServerProcess(tiny_home.root, logs / "serve.log", new_keys(app=5),
                         {"PRIVBERT_RATE_LIMIT_PER_KEY": "0", **no_worker,
                          "PRIVBERT_DEFAULT_BUDGET": str(DEFAULT_BUDGET)}).launch()
    tight = ServerProcess(tiny_home.root, logs / "serve-tight.log", new_keys(app=8),
                          {**TIGHT, **no_worker}).launch()
    try:
        yield main.start(), tight.start()
    finally:
        main.stop()
        tight.stop()


@pytest.fixture(scope="session")
def server(servers) -> ServerProcess:
    return servers[0]


@pytest.fixture(scope="session")
def tight_server(servers) -> ServerProcess:
    return servers[1]


def payloads_for(model: dict, texts: list[str], bundle=None) -> list:
    """Payloads for ``model`` (as GET /v1/models describes it) made by the edge's
    Privatizer with the model's bundle (fetched from the home by the caller)."""
    from edge_agent import Privatizer
    from shared.mechanisms import DChiEmbedding, DChiText

    eta = model["params"]["eta"]
    mech = DChiText(bundle, eta) if model["mechanism"] == "dchi-text" else DChiEmbedding(eta)
    return Privatizer(bundle, mech).privatize(texts)


@pytest.fixture(scope="session")
def tiny_bundle_of_home(tiny_home):
    from shared.bundle import EdgeBundle

    return EdgeBundle.from_model(tiny_home.base)


def body_of(payloads: list) -> str:
    return '{"payloads":[' + ",".join(p.model_dump_json(exclude_none=True)
                                      for p in payloads) + "]}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    """An empty database of each kind: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'privbert.db'}"
    return request.getfixturevalue("fresh_postgres_url")


@pytest.fixture
def db(db_url):
    """A migrated :class:`cloud_api.store.db.Database` on each kind (every test that takes
    it runs on both)."""
    from cloud_api.store.db import Database

    database = Database(db_url, busy_timeout_s=10.0, connect_timeout_s=5.0)
    database.upgrade()
    yield database
    database.dispose()
