"""Inference backends: a loaded model version that turns a batch of checked payloads into
class probabilities (N, C) float32, in input order.

* :class:`TorchBackend` — ``models.versions.model_version.load_model``; CUDA with bf16/fp16 autocast when
  a GPU is present (``models.nets.backbone.pick_device`` / ``autocast_dtype``), CPU otherwise;
  the forward runs under ``torch.inference_mode()``.
* :class:`OnnxBackend` — ``models.export.onnx_classifier.OnnxClassifier`` over the version's
  ``classifier.onnx`` (CPU). It imports no torch (neither does this module), so that the
  serve image carries none: torch is imported only when the torch backend is chosen.
* ``auto`` (the default) — per version, the fastest of these that keeps the accuracy:
  torch on a GPU, else ``onnx-int8``, else ``onnx``, else torch on the CPU.
* ``onnx-int8`` — the same over ``classifier.int8.onnx`` (``models.export.quantize``), loaded only
  when it was made from this version's ``classifier.onnx`` and this CPU's integer kernel
  is exact on its weights (``OnnxClassifier``'s checks). A version without such a file is
  served by its ``classifier.onnx`` or refused, as ``PRIVBERT_INT8_FALLBACK`` says; a file
  made from another version's ONNX file is always refused.

Both run one warm-up forward when loaded, so a loaded backend is a warmed one, and one whose
warm-up scores are finite (:func:`warm_up`). A backend is not safe for concurrent forwards:
the batcher calls :meth:`Backend.forward` from one thread at a time. The version folder is
verified whole before a backend reads it (``cloud_api.serving.loading``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from cloud_api.settings import Settings
from models.export.onnx_classifier import Int8Refused, OnnxClassifier
from models.training.data import collate_payloads, example_payload_arrays
from models.versions.version_folder import (
    DENOISER_FILE,
    INT8_FILE,
    METRICS_FILE,
    ONNX_FILE,
    read_config,
)
from shared.mechanisms import registry
from shared.payload import make_payload

if TYPE_CHECKING:  # torch: only for the torch backend (the serve image has none)
    from models.versions.model_version import ModelVersion

log = logging.getLogger(__name__)


class BackendError(Exception):
    """A version folder that cannot be served by the chosen backend (message says why)."""


class Backend(Protocol):
    name: str
    config: dict
    metrics: dict
    path: Path
    overhead_tokens: float  # a forward's fixed cost in padded tokens (the batcher's split)

    def forward(self, payloads: Sequence) -> np.ndarray:
        """Probabilities (N, C) float32 for checked payloads, in input order."""

    def close(self) -> None:
        """Release the model (memory, sessions)."""


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float32, copy=False)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)  # in place: one temporary less (a lone request's
    return e                           # logits are 1 x 2, numpy's per-call cost is all)


def _collate(config: dict, payloads: Sequence, as_numpy: bool = False) -> dict:
    return collate_payloads(payloads, config, as_numpy=as_numpy)


def warm_up(backend) -> None:
    """One forward of :func:`warmup_payloads`; BackendError when a score is not finite (the
    version's weights are corrupt, or its training diverged)."""
    probs = backend.forward(warmup_payloads(backend.config))
    if not np.isfinite(probs).all():
        raise BackendError(f"{backend.path}: non-finite scores on the warm-up payloads (the "
                           "version's weights are corrupt or its training diverged); "
                           "promote another version")


def warmup_payloads(config: dict, n: int = 2) -> list:
    """Small valid payloads for ``config``'s model (random contents; never user data)."""

    rng = np.random.default_rng(0)
    arrays, segments = example_payload_arrays(config, rng, n)
    params = dict(config["params"])
    bits = registry.get(config["mechanism"]).payload_kind is registry.PayloadKind.BITS
    out = []
    for a, seg in zip(arrays, segments, strict=True):
        if bits:
            a = a.astype(np.uint8)
        out.append(make_payload(config["mechanism"], params, config["bundle_id"], a,
                                list(seg) if seg else None))
    return out


class TorchBackend:
    """A version folder served by torch."""

    name = "torch"
    overhead_tokens = 32.0  # MiniLM, one thread (python -m bench.serve --padding)
    version: ModelVersion | None  # None once closed

    def __init__(self, path: str | os.PathLike, settings: Settings):
        # lazy: torch, only for the torch backend (the serve image has none)
        import torch

        from models.nets.backbone import autocast_dtype, pick_device
        from models.versions.model_version import load_model

        self.threads = settings.torch_threads
        if self.threads:
            torch.set_num_threads(self.threads)
        self.path = Path(path)
        try:
            self.device = pick_device(settings.device)
            self.amp = autocast_dtype(self.device, settings.precision)
            self.version = load_model(self.path, self.device, verify=False)  # loading.py did
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        except (OSError, KeyError, RuntimeError) as exc:
            raise BackendError(f"{self.path}: cannot be loaded ({type(exc).__name__}: "
                               f"{exc})") from None
        self.config = self.version.config
        self.metrics = self.version.metrics
        self._torch = torch
        warm_up(self)

    def forward(self, payloads: Sequence) -> np.ndarray:
        torch = self._torch
        if self.threads and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)  # OpenMP keeps the count per thread
        if self.version is None:
            raise BackendError(f"{self.path}: closed")
        batch = _collate(self.config, payloads)
        module = self.version.module
        with torch.inference_mode():
            feed = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                logits = module(**feed)
            probs = torch.softmax(logits.float(), dim=-1)
            return probs.cpu().numpy().astype(np.float32, copy=False)

    def close(self) -> None:
        version = getattr(self, "version", None)
        if version is not None:
            version.module = None
        self.version = None
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            self._torch.cuda.empty_cache()


class Int8Unavailable(BackendError):
    """No int8 file this CPU can serve for a version (missing, or its weights would
    saturate this CPU's kernel): PRIVBERT_INT8_FALLBACK decides."""


class OnnxBackend:
    """A version folder served by onnxruntime (its ``classifier.onnx``, or with ``int8``
    its ``classifier.int8.onnx``; CPU)."""

    classifier: OnnxClassifier | None  # None once closed

    def __init__(self, path: str | os.PathLike, settings: Settings, int8: bool = False):
        self.path = Path(path)
        self.name = "onnx-int8" if int8 else "onnx"
        self.overhead_tokens = 6.0 if int8 else 8.0  # MiniLM, one thread (--padding)
        try:
            cfg = read_config(self.path)
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        if "denoiser" in (cfg.get("architecture") or {}) and \
                not (self.path / DENOISER_FILE).is_file():  # the graph holds it; the version
            raise BackendError(f"{self.path}: the model reads a contextual denoiser but the "
                               f"version has no {DENOISER_FILE}: it is incomplete and cannot "
                               "be loaded")  # must travel whole all the same
        file = self.path / (INT8_FILE if int8 else ONNX_FILE)
        if int8 and not file.is_file():
            raise Int8Unavailable(f"version {self.path.name} has no {INT8_FILE} for the "
                                  f"onnx-int8 backend (cloud-api export-bundle --onnx --model "
                                  f"DIR, or cloud-api models register, builds it)")
        if not file.is_file():
            raise BackendError(f"{self.path}: no {ONNX_FILE} for the onnx backend (export it "
                               f"with models.export.writers.export_classifier_onnx, or serve with "
                               f"PRIVBERT_BACKEND=torch)")
        try:
            # one session, built with the thread count (PRIVBERT_TORCH_THREADS) if set
            self.classifier = OnnxClassifier(self.path, threads=settings.torch_threads,
                                             int8=int8)
        except Int8Refused as exc:
            if "saturates" in str(exc):
                raise Int8Unavailable(str(exc)) from None
            raise BackendError(str(exc)) from None
        except Exception as exc:  # onnxruntime raises its own exception types
            raise BackendError(f"{file}: cannot be loaded ({type(exc).__name__}: "
                               f"{exc})") from None
        self.kernel = self.classifier.kernel  # the int8 kernel check (None for fp32)
        self.config = self.classifier.config
        mpath = self.path / METRICS_FILE
        import json

        self.metrics = json.loads(mpath.read_text()) if mpath.is_file() else {}
        warm_up(self)

    def forward(self, payloads: Sequence) -> np.ndarray:
        if self.classifier is None:
            raise BackendError(f"{self.path}: closed")
        return _softmax(self.classifier.logits(_collate(self.config, payloads, as_numpy=True)))

    def close(self) -> None:
        self.classifier = None


def load_backend(path: str | os.PathLike, settings: Settings) -> Backend:
    """The backend ``settings.backend`` over the version folder ``path`` (loaded and warmed).

    BackendError says why a folder cannot be served."""
    if settings.backend == "auto":
        return _fastest(Path(path), settings)
    if settings.backend == "onnx-int8":
        try:
            return OnnxBackend(path, settings, int8=True)
        except Int8Unavailable as exc:
            if settings.int8_fallback != "fp32":
                raise BackendError(f"{exc} (PRIVBERT_INT8_FALLBACK=refuse)") from None
            log.warning("serving %s with the fp32 onnx backend: %s", path, exc)
            return OnnxBackend(path, settings)
    if settings.backend == "onnx":
        return OnnxBackend(path, settings)
    return TorchBackend(path, settings)


def _fastest(path: Path, settings: Settings) -> Backend:
    """``PRIVBERT_BACKEND=auto``: the fastest backend this version and machine offer that
    keeps the accuracy (int8 against fp32: ``bench/int8.py``): torch on a GPU; else the
    version's int8 file where this CPU computes it exactly; else its fp32
    ``classifier.onnx``; else torch on the CPU."""
    if settings.wants_gpu() and (path / "model.safetensors").is_file():
        return TorchBackend(path, settings)
    if (path / INT8_FILE).is_file():
        try:
            return OnnxBackend(path, settings, int8=True)
        except Int8Unavailable as exc:
            log.warning("serving %s without its int8 file: %s", path, exc)
    if (path / ONNX_FILE).is_file():
        return OnnxBackend(path, settings)
    return TorchBackend(path, settings)
