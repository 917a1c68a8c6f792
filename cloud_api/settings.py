"""Service settings (pydantic-settings): environment variables with the prefix ``PRIVBERT_``.

    PRIVBERT_HOME=/srv/privbert PRIVBERT_API_KEYS=k1,k2 PRIVBERT_ADMIN_KEYS=a1 cloud-api serve

Every knob of the service lives here, one obvious place: storage, keys, request limits
(defaults in the spirit of text-embeddings-inference), the micro-batcher, the inference
backend, and the job worker (``cloud-api worker``). ``cloud-api`` flags override the
environment.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

KeyList = Annotated[list[SecretStr], NoDecode]
_VISIBLE_ASCII = re.compile(r"^[\x21-\x7e]+$")


def normalize_key(value: str) -> str:
    """A key as the server reads it, wherever it comes from: ``PRIVBERT_API_KEYS``,
    ``PRIVBERT_ADMIN_KEYS``, ``PRIVBERT_DEMO_KEY``, the keys file and the bearer token of
    every request. Surrounding whitespace is not part of a key (an ``.env`` line or a
    header may carry it), so "is this an admin key" has one answer everywhere."""
    return value.strip()


def check_key(value: str, where: str | None = None) -> str:
    """``value`` normalized (:func:`normalize_key`); ValueError naming ``where`` (never the
    key) unless it is 1 or more visible ASCII characters: a key with a space, a control
    character or a non-ASCII letter inside could never be sent as a bearer token as it is
    written."""
    key = normalize_key(value)
    if not _VISIBLE_ASCII.match(key):
        what = "is empty" if not key else "holds a space, a control or a non-ASCII character"
        raise ValueError(f"{where + ': ' if where else ''}a key {what}; keys are visible "
                         "ASCII characters")
    return key
OriginList = Annotated[list[str], NoDecode]
_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\[\]:-]+$")


class Settings(BaseSettings):
    """All settings of ``cloud-api serve`` and ``cloud-api worker``."""

    model_config = SettingsConfigDict(env_prefix="PRIVBERT_", extra="ignore",
                                      validate_default=True)

    # -- storage ----------------------------------------------------------------------------
    home: Path = Field(Path("./var"), description="the model home: model versions, bundles, "
                       "job folders, and the default SQLite database")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default "
                                     "sqlite:///$PRIVBERT_HOME/privbert.db (PostgreSQL: "
                                     "postgresql+psycopg://user@host/db)")
    # (record store) database connection knobs
    db_auto_upgrade: bool | None = Field(None, description="apply Alembic migrations when "
                                         "serve starts; default: yes for SQLite, no for "
                                         "PostgreSQL (run `cloud-api db upgrade`)")
    db_busy_timeout_s: float = Field(5.0, gt=0, description="SQLite: wait this long for a "
                                     "lock, then 503")
    db_connect_timeout_s: float = Field(5.0, gt=0, description="PostgreSQL: connect "
                                        "timeout, then 503")
    db_pool_size: int = Field(5, ge=1, description="connections kept per process")
    model_store: Literal["home", "database"] = Field(
        "home", description="where model versions, promotions and bundles live: 'home' "
        "($PRIVBERT_HOME on disk, shared by the processes of one machine) or 'database' "
        "(the database, for replicas with no shared volume; $PRIVBERT_HOME is then this "
        "host's cache: docs/deployment.md)")
    model_sync_interval_s: float = Field(2.0, gt=0, description="with model_store=database: "
                                         "how often a replica reads the promotions")
    ready_db_timeout_s: float = Field(2.0, gt=0, description="/readyz: the database must "
                                      "answer a SELECT 1 within this")

    # -- keys -------------------------------------------------------------------------------
    api_keys: KeyList = Field(default_factory=list, description="application keys for /v1 "
                              "(comma-separated)")
    admin_keys: KeyList = Field(default_factory=list, description="admin keys for /admin and "
                                "/v1 (comma-separated)")
    keys_file: Path | None = Field(None, description="file of keys, one per line: "
                                   "'app KEY', 'admin KEY', or 'app sha256:HEX' (only the hash)")
    auth_disabled: bool = Field(False, description="no keys at all: local development only")

    # -- browsers (cloud_api/routes/web.py) -------------------------------------------------
    cors_origins: OriginList = Field(default_factory=list, description="origins whose pages "
                                     "may call /v1 (comma-separated, e.g. "
                                     "https://app.example.com; * for any); none by default. "
                                     "Never /admin")
    demo: bool = Field(False, description="serve the privacy explorer page at /demo (same "
                       "origin; build it first: scripts/build_web.sh)")
    demo_dir: Path | None = Field(None, description="the built page (default "
                                  "web_edge/demo/dist beside the cloud_api package)")
    demo_key: SecretStr | None = Field(None, description="an application key handed to the "
                                       "/demo page (anyone who opens it can read it: a "
                                       "throwaway key with a small PRIVBERT_DEFAULT_BUDGET, "
                                       "never a production key); unset, the page asks for one")

    default_budget: float | None = Field(None, ge=0, allow_inf_nan=False, description="the "
                                         "privacy budget cap (worst-case epsilon) a key gets "
                                         "when it is first charged; none by default (every "
                                         "payload is still counted)")
    default_device_budget: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="the cap (worst-case epsilon) of a "
        "device's own ledger (X-Device-Id) when it is first charged, never above its key's; "
        "none by default (a device is then bounded by its key's cap alone)")

    # -- request limits ---------------------------------------------------------------------
    max_body_bytes: int = Field(2_000_000, ge=1024, description="413 above this, enforced "
                                "while the body is read")
    max_payloads_per_request: int = Field(512, ge=1)
    max_tokens_per_payload: int | None = Field(None, ge=1, description="default: the model's "
                                               "max_length")
    max_concurrent_requests: int = Field(512, ge=1, description="429 above this")
    rate_limit_per_key: float = Field(200.0, ge=0, description="requests per second per key "
                                      "(0 = no limit)")
    rate_limit_burst: int = Field(400, ge=1)
    rate_limit_store: Literal["memory", "database"] = Field(
        "memory", description="where the per-key token buckets live: 'memory' (each "
        "process its own) or 'database' (one bucket per key for every replica sharing the "
        "database)")

    # -- micro-batching ---------------------------------------------------------------------
    max_batch_size: int = Field(32, ge=1, description="payloads per model forward")
    max_batch_tokens: int = Field(16384, ge=1, description="padded tokens per forward")
    max_wait_ms: float = Field(5.0, ge=0, description="how long the batcher waits to fill "
                               "a batch")
    max_queue_size: int = Field(2048, ge=1, description="payloads waiting per model version "
                                "(full -> 429)")
    queue_timeout_s: float = Field(30.0, gt=0, description="a payload that waited this long "
                                   "gets 503")
    inline_when_idle: bool = Field(True, description="a lone one-payload request runs its "
                                   "forward on the event loop when nothing else is queued or "
                                   "running (no thread hand-off; cloud_api/serving/batcher.py)")

    # -- inference backend ------------------------------------------------------------------
    backend: Literal["auto", "torch", "onnx", "onnx-int8"] = Field(
        "auto", description="auto (per version, the fastest of its files that keeps the "
        "accuracy: torch on a GPU, else classifier.int8.onnx, else classifier.onnx, else "
        "torch on the CPU) "
        "| torch | onnx (classifier.onnx, fp32) | onnx-int8 (classifier.int8.onnx, built by "
        "export and register; see int8_fallback)")
    int8_fallback: Literal["fp32", "refuse"] = Field(
        "fp32", description="onnx-int8, for a version without an int8 file this CPU can "
        "serve: fp32 = serve its classifier.onnx, refuse = do not load it (predictions 503)")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    torch_threads: int | None = Field(None, ge=1)
    inference_workers: int | None = Field(
        None, ge=1, le=64, description="inference replicas (copies of the model) per "
        "served version, each running its own batches in its own thread; unset: the onnx "
        "backends with torch_threads set get usable cores / torch_threads (one replica per "
        "core keeps every core busy with small batches), torch gets 1")

    def wants_gpu(self) -> bool:
        """Whether the torch backend would run on a GPU here: ``device`` cuda, or auto with
        an NVIDIA device node present and torch seeing it (torch is imported only then)."""
        if self.device.startswith("cuda"):
            return True
        if self.device != "auto" or not any(Path("/dev").glob("nvidia[0-9]*")):
            return False
        try:
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())

    def inference_replicas(self) -> int:
        """The inference replicas per served version (``PRIVBERT_INFERENCE_WORKERS``, or
        its default)."""
        if self.inference_workers is not None:
            return self.inference_workers
        if self.backend == "torch" or self.torch_threads is None:
            return 1  # torch: one replica (a second one cost the tail); onnx: all cores
        if self.backend == "auto" and self.wants_gpu():
            return 1  # auto serves with torch on the GPU
        return max(1, len(os.sched_getaffinity(0)) // self.torch_threads)
    allow_none: bool = Field(False, description="serve models of mechanism 'none' (plain "
                             "token ids: the Null-privacy baseline only)")
    allow_weak_privacy: bool = Field(False, description="accept task declarations whose "
                                     "mechanism parameters are weaker than the privacy "
                                     "floor (shared.floor: payloads close to the raw text); "
                                     "experiments only")
    reload_interval_s: float = Field(2.0, gt=0, description="how often promoted pointers "
                                     "written by other processes are checked")

    # -- the job worker (cloud-api worker, or a thread of serve) ----------------------------
    worker_in_serve: bool = Field(True, description="run one job worker thread inside serve")
    worker_poll_s: float = Field(1.0, gt=0)
    heartbeat_s: float = Field(2.0, gt=0)
    heartbeat_timeout_s: float = Field(30.0, gt=0, description="a running job without a "
                                       "heartbeat for this long is failed or retried")
    reaper_interval_s: float = Field(5.0, gt=0)
    max_attempts: int = Field(2, ge=1)
    torchrun_nproc: int = Field(0, ge=0, description="> 0: train with torchrun "
                                "--nproc-per-node N (DDP)")
    torchrun_args: str = Field("", description="extra torchrun flags (multi-node rendezvous)")
    min_records_per_label: int = Field(8, ge=1, description="retraining needs this many "
                                       "records of every label")
    pretrain_corpus: Path | None = Field(None, description="public text file (one text a "
                                         "line) of pretraining jobs; default AG News in "
                                         "../shared/data/corpus/agnews.txt")

    # -- logging ----------------------------------------------------------------------------
    log_level: str = "INFO"
    log_json: bool = True

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _split(cls, v):
        if isinstance(v, str):
            return [k for k in v.split(",") if normalize_key(k)]
        return v

    @field_validator("api_keys", "admin_keys")
    @classmethod
    def _keys(cls, v: list[SecretStr]) -> list[SecretStr]:
        return [SecretStr(check_key(k.get_secret_value())) for k in v]

    @field_validator("demo_key")
    @classmethod
    def _demo_key(cls, v: SecretStr | None) -> SecretStr | None:
        """Normalized as every key is: the page is handed the key the server checks."""
        if v is None:
            return None
        return SecretStr(check_key(v.get_secret_value()))

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, v):
        if isinstance(v, str):
            v = [o.strip() for o in v.split(",") if o.strip()]
        return v

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        """Each origin as a browser sends it: scheme://host[:port], no path, or ``*``."""
        for o in v:
            if o != "*" and not _ORIGIN.match(o):
                raise ValueError(f"{o!r} is not an origin (scheme://host[:port], no path "
                                 "and no trailing slash)")
        return v

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'privbert.db').resolve()}"


def settings_error(exc: ValueError) -> str:
    """One line for a pydantic ValidationError of :class:`Settings`: each variable and what
    is wrong with it (the value is repeated, except for keys)."""
    errors = getattr(exc, "errors", None)
    if errors is None:
        return str(exc)
    parts = []
    for e in errors():
        field = "_".join(str(x) for x in e.get("loc", ())) or "settings"
        got = "" if "key" in field or "input" not in e else f" (got {e['input']!r})"
        parts.append(f"PRIVBERT_{field.upper()}: {e.get('msg', 'invalid')}{got}")
    return "invalid settings: " + "; ".join(parts)
