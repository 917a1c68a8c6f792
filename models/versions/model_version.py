"""Model versions on disk: one folder each, written under a temporary name and renamed.

Layout of a version folder::

    config.json        format, kind, mechanism + params, bundle_id, special ids, labels,
                       max_length, base model, architecture, privacy guarantee
    model.safetensors  the classifier's weights (frozen word embeddings included)
    metrics.json       dev metrics per epoch and of the kept (best) epoch
    posterior.npz      optional: the channel posterior the model reads (``models.training.posterior``),
                       for retraining from device records
    denoiser.safetensors  the contextual denoiser the model reads, when its architecture names
                       one (``models.attacks.denoiser``): without it the version refuses to load
    data.json          fingerprint of the training (and dev) records, counts, hyperparameters
    classifier.onnx    optional, written by ``export_classifier_onnx``
    manifest.json      every other file's SHA-256 (``models.versions.manifest``): written when the
                       version is made (its arrays checked finite), checked when it is
                       registered in ``$PRIVBERT_HOME`` (which records the manifest's own
                       digest in its database), kept current by the writers that add files
                       later (ONNX export, int8: a home version so changed must then be
                       resealed, ``cloud-api models reseal``), checked on load

Nothing in a version folder holds raw text: payloads are privatized, labels are short
class names.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.attacks.denoiser import Denoiser
from models.nets.classifiers import TokenClassifier, architecture
from models.training.data import collate_payloads, kind_of
from models.versions.manifest import MANIFEST_FILE, seal, verify_folder
from models.versions.version_folder import (
    CONFIG_FILE,
    DATA_FILE,
    DENOISER_FILE,
    FORMAT,
    FORMAT_VERSION,
    METRICS_FILE,
    WEIGHTS_FILE,
)
from models.versions.version_module import load_classifier
from shared.mechanisms import registry


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n").encode()


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def check_out_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Raise ValueError if ``out_dir`` exists (and ``overwrite`` is off): checked before training."""
    out = Path(out_dir)
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: already exists (a model version is never overwritten; "
                         "choose a new --out)")
    return out


def save_model_version(out_dir: str | os.PathLike, module: nn.Module, config: dict,
                       metrics: dict, data_info: dict, overwrite: bool = False,
                       extra_files: dict[str, bytes] | None = None) -> Path:
    """Write a complete version folder atomically: a temporary sibling, then one rename.
    ``extra_files``: more files of the version by name (``posterior.npz``)."""
    out = check_out_dir(out_dir, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    cfg = dict(config)
    cfg.update({"format": FORMAT, "format_version": FORMAT_VERSION,
                "architecture": architecture(module)})
    extra_files = dict(extra_files or {})
    denoiser = getattr(module, "denoiser", None)
    if getattr(module, "contextual", False):
        if denoiser is None:
            raise ValueError("the classifier reads a contextual denoiser but none is attached")
        extra_files[DENOISER_FILE] = denoiser.to_bytes()  # the version travels whole
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        state = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()
                 if not k.startswith("denoiser.")}  # its own file, without the shared table
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": FORMAT})
        (tmp / METRICS_FILE).write_bytes(_json_bytes(metrics))
        (tmp / DATA_FILE).write_bytes(_json_bytes(data_info))
        for name, data in extra_files.items():
            if name in (CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE, DATA_FILE, MANIFEST_FILE) or \
                    "/" in name:
                raise ValueError(f"extra file name {name!r} is reserved or not a plain name")
            (tmp / name).write_bytes(data)
        (tmp / CONFIG_FILE).write_bytes(_json_bytes(cfg))  # last: its presence = complete
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        seal(verify_folder(tmp))  # sealed when made (issue 42): its arrays finite, a manifest
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out




@dataclass
class ModelVersion:
    """A loaded model version: its config, metrics and torch module (eval mode)."""

    path: Path
    config: dict
    metrics: dict
    module: nn.Module

    @property
    def mechanism(self) -> str:
        return self.config["mechanism"]

    @property
    def kind(self) -> str:
        return kind_of(self.mechanism)

    @property
    def params(self) -> dict:
        return self.config["params"]

    @property
    def bundle_id(self) -> str:
        return self.config["bundle_id"]

    @property
    def labels(self) -> list[str]:
        return list(self.config["labels"])

    @property
    def max_length(self) -> int:
        return int(self.config["max_length"])

    @property
    def special_ids(self) -> dict[str, int]:
        return dict(self.config["special_ids"])

    def check_payload(self, payload) -> None:
        """ValueError unless ``payload`` was made for this model (mechanism, parameters,
        bundle, dimension). TextHide payloads may use another k (k=1 for predictions)."""
        if payload.mechanism != self.mechanism:
            raise ValueError(f"payload mechanism {payload.mechanism!r} does not match the "
                             f"model's {self.mechanism!r}")
        if payload.bundle_id != self.bundle_id:
            raise ValueError(f"payload bundle {payload.bundle_id[:12]}… is not the model's "
                             f"{self.bundle_id[:12]}… (fetch the model's bundle)")
        compared = registry.get(self.mechanism).compared_params  # TextHide: m, not k
        got, want = compared(payload.params.model_dump()), compared(self.params)
        if registry.differing_params(got, want):
            raise ValueError(f"payload parameters {got} do not match the model's {want}")
        arch = self.config["architecture"]
        arr = payload.data_array()
        if self.kind == "vector" and arr.shape[-1] != arch["in_dim"]:
            raise ValueError(f"payload dimension {arr.shape[-1]} is not the model's "
                             f"{arch['in_dim']}")
        if self.kind == "tokens" and arr.size:
            vocab = int(arch["bert_config"]["vocab_size"])
            if arr.min() < 0 or arr.max() >= vocab:
                raise ValueError(f"payload token id {int(arr.max())} is outside the model's "
                                 f"vocabulary [0, {vocab})")
        if self.kind == "embeddings" and arr.shape[-1] != arch["bert_config"]["hidden_size"]:
            raise ValueError(f"payload embedding dimension {arr.shape[-1]} is not the model's "
                             f"{arch['bert_config']['hidden_size']}")

    def collate(self, payloads: Sequence) -> dict[str, torch.Tensor]:
        """Padded CPU tensors for ``payloads`` (checked with :meth:`check_payload` first)."""
        return collate_payloads(payloads, self.config)

    @torch.no_grad()
    def predict_proba(self, payloads: Sequence, batch_size: int = 64,
                      device: torch.device | str | None = None) -> np.ndarray:
        """Class probabilities (N, C) for validated payloads, in input order."""
        for p in payloads:
            self.check_payload(p)
        dev = torch.device(device) if device is not None else next(self.module.parameters()).device
        self.module.to(dev).eval()
        out = np.empty((len(payloads), len(self.labels)), dtype=np.float32)
        order = np.argsort([getattr(p, "n_tokens", 1) for p in payloads], kind="stable")
        for s in range(0, len(order), batch_size):
            idx = order[s: s + batch_size]
            batch = self.collate([payloads[i] for i in idx])
            logits = self.module(**{k: v.to(dev) for k, v in batch.items()})
            out[idx] = torch.softmax(logits.float(), dim=-1).cpu().numpy()
        return out


def attach_version_denoiser(module: TokenClassifier, path: Path, cfg: dict) -> None:
    """Attach the version's ``denoiser.safetensors`` to ``module``; ValueError (one line) if
    it is missing, unreadable or made for another mechanism, η or bundle."""
    f = path / DENOISER_FILE
    if not f.is_file():
        raise ValueError(f"{path}: the model reads a contextual denoiser but the version has "
                         f"no {DENOISER_FILE}: it is incomplete and cannot be loaded")
    d = Denoiser.load(f, module.bert.embeddings.word_embeddings)
    d.check_for(cfg["mechanism"], cfg["params"], cfg["bundle_id"])
    module.attach_denoiser(d)


def load_model(path: str | os.PathLike, device: torch.device | str = "cpu",
               verify: bool = True) -> ModelVersion:
    """Load a model version folder written by :func:`save_model_version`; with ``verify``,
    first checked whole (``models.versions.manifest.verify_folder``: IntegrityError, a ValueError)."""
    p = Path(path)
    cfg, module = load_classifier(p, verify)
    if isinstance(module, TokenClassifier) and module.contextual:
        attach_version_denoiser(module, p, cfg)
    module.to(device).eval()
    metrics_path = p / METRICS_FILE
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    return ModelVersion(p, cfg, metrics, module)
