"""Loading one model version to serve it: its backends (one per inference replica), the
checker of its payloads, its edge bundle and its ``/v1/models`` entry. Runs in a thread
(it reads the folder and loads the weights); :mod:`cloud_api.serving.hot_swap` decides
which version to load and when.

A version is verified whole before anything of it is read (``models.versions.manifest``: every file
against its SHA-256 in ``manifest.json``); one from before manifests is checked for finite
weights, loaded, and sealed once its backends have loaded and warmed with finite scores
(its first verified load). A version that is not whole is a BackendError naming the file.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_api.errors import InvalidRequest, NotFound, ServiceError
from cloud_api.home import ModelHome, seal_verified
from cloud_api.serving.backends import Backend, BackendError, load_backend
from cloud_api.serving.batcher import Batcher
from cloud_api.serving.bundles import BundleStore
from cloud_api.serving.checks import PayloadChecker
from cloud_api.settings import Settings
from models.versions.manifest import verify_folder
from models.versions.version_folder import read_config
from shared.bundle import BundleError, EdgeBundle
from shared.mechanisms import registry as mechanisms

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Served:
    """One loaded version: its backends (one per inference replica), payload checker,
    batcher, and its /v1/models entry."""

    model_id: str
    version: str
    backends: list[Backend]
    checker: PayloadChecker
    info: dict
    batcher: Batcher | None = None
    labels: list[str] = field(default_factory=list)

    @property
    def backend(self) -> Backend:
        return self.backends[0]


def json_safe(obj):
    """``obj`` with non-finite floats as None (JSON has no Infinity or NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def load_version(settings: Settings, home: ModelHome, bundles: BundleStore, model_id: str,
                 version: str) -> Served:
    """``version`` of ``model_id`` loaded and warmed, without a batcher yet; BackendError
    when its folder or mechanism cannot be served here."""
    path = home.version_dir(model_id, version)
    try:  # against its manifest, and the manifest against the digest recorded at sealing
        verified = home.verify(model_id, version, seal_missing=False)
    except InvalidRequest as exc:
        raise BackendError(exc.detail) from None
    if not verified.sealed:  # a home without records: the digests to seal it with later
        verified = verify_folder(path)
    try:
        config = read_config(path)
    except ValueError as exc:
        raise BackendError(str(exc)) from None
    name: Any = config.get("mechanism")  # as the file has it: get() refuses what it lacks
    try:
        mech = mechanisms.get(name)
    except mechanisms.UnknownMechanism as exc:
        raise BackendError(str(exc)) from None
    if not mech.private and not settings.allow_none:
        raise BackendError(f"mechanism '{mech.name}' (plain token ids, the Null-privacy "
                           "baseline) is served only with PRIVBERT_ALLOW_NONE=1")
    bundle = bundle_for(bundles, config)
    backends: list[Backend] = []
    try:
        for _ in range(settings.inference_replicas()):
            backends.append(load_backend(path, settings))
    except BaseException:
        for b in backends:
            b.close()
        raise
    backend = backends[0]
    if not verified.sealed:  # its first verified load: loaded and warmed with finite scores
        if seal_verified(verified, f"version {version} of model {model_id}"):
            home.record_seal(model_id, version)
    checker = PayloadChecker(backend.config, bundle, settings.max_tokens_per_payload)
    info = models_entry(model_id, version, backend, checker)
    return Served(model_id, version, backends, checker, info,
                  labels=list(backend.config["labels"]))


def bundle_for(bundles: BundleStore, config: dict):
    """The model's bundle (for its unused ids), saved in the home when it can be rebuilt
    from the model's base BERT folder; None when unknown (the model still serves)."""
    bid = config["bundle_id"]
    try:
        return bundles.get(bid)
    except NotFound:
        pass
    except ServiceError as exc:
        log.warning("bundle %s of a served model: %s", bid[:12], exc.detail)
        return None
    base = config.get("base_model")
    if base and base != "default MiniLM-L6-H384":

        try:
            if Path(base).is_dir():
                b = EdgeBundle.from_model(base)
                if b.bundle_id == bid:
                    bundles.add(b)
                    return b
        except (BundleError, OSError, ValueError) as exc:
            log.warning("bundle %s not rebuilt from %s: %s", bid[:12], base, exc)
    log.warning("bundle %s of model version is not on this server: GET /v1/bundles will "
                "answer 404 for it", bid[:12])
    return None


def models_entry(model_id: str, version: str, backend: Backend,
                 checker: PayloadChecker) -> dict:
    """The version's ``GET /v1/models`` entry: labels, mechanism and parameters, bundle,
    limits, guarantee and dev metrics (JSON-safe)."""
    cfg, m = backend.config, backend.metrics or {}
    dev = dict(m.get("dev") or {})
    dev.pop("labels", None)
    if m.get("best_epoch") is not None:
        dev["best_epoch"] = m["best_epoch"]
    return json_safe({
        "id": model_id, "task": cfg.get("task") or model_id, "labels": list(cfg["labels"]),
        "mechanism": cfg["mechanism"], "params": dict(cfg["params"]),
        "bundle_id": cfg["bundle_id"], "max_length": int(cfg["max_length"]),
        "max_tokens": checker.max_tokens, "guarantee": cfg.get("guarantee"),
        "metrics": dev, "version": version, "backend": backend.name,
    })
