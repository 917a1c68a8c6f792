"""A model version folder's file names and its ``config.json``, without torch.

The layout is described in :mod:`models.versions.model_version` (which writes and loads the weights with
torch); this module is what a torch-free reader needs: the onnx serving backend
(:mod:`models.export.onnx_classifier`) and ``cloud_api.serving``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FORMAT = "privbert-model"
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE, METRICS_FILE, DATA_FILE = (
    "config.json", "model.safetensors", "metrics.json", "data.json")
ONNX_FILE = "classifier.onnx"
DENOISER_FILE = "denoiser.safetensors"  # models.attacks.denoiser (the contextual posterior)
INT8_FILE = "classifier.int8.onnx"  # models.export.quantize
BUNDLE_DIR = "bundle"  # the edge bundle a version was trained with, when it is not the
# default one (a designed privatization table: ``cloud-api train --table``)


def is_model_dir(path: str | os.PathLike) -> bool:
    """True if ``path`` is a privbert model version folder (not a plain BERT folder)."""
    cfg = Path(path) / CONFIG_FILE
    if not cfg.is_file():
        return False
    try:
        return json.loads(cfg.read_text()).get("format") == FORMAT
    except (json.JSONDecodeError, OSError, AttributeError):
        return False


def read_config(path: str | os.PathLike) -> dict:
    """config.json of a model version folder; ValueError if it is not one."""
    p = Path(path)
    cfg_path = p / CONFIG_FILE
    if not cfg_path.is_file():
        raise ValueError(f"{p}: not a model folder (no {CONFIG_FILE})")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{cfg_path}: not valid JSON ({exc})") from None
    if cfg.get("format") != FORMAT:
        raise ValueError(f"{p}: not a privbert model folder (config format "
                         f"{cfg.get('format')!r})")
    if cfg.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{p}: model format version {cfg.get('format_version')} is not "
                         f"{FORMAT_VERSION}")
    return cfg


DENOISER_FORMAT = "privbert-denoiser"
DENOISER_FORMAT_VERSION = 1


def safetensors_metadata(data: bytes) -> dict:
    """The ``__metadata__`` of a safetensors blob (its JSON header), without torch."""
    if len(data) < 8:
        raise ValueError("too short for a safetensors file")
    n = int.from_bytes(data[:8], "little")
    if not 0 < n <= len(data) - 8:
        raise ValueError("bad safetensors header length")
    try:
        return json.loads(data[8:8 + n]).get("__metadata__") or {}
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise ValueError(f"bad safetensors header ({exc})") from None


def denoiser_header(data: bytes, where: str = "denoiser") -> dict:
    """The privbert header of a denoiser file (``models.attacks.denoiser``): format, ``meta``
    (mechanism, eta, bundle_id, training) and ``bert_config``; ValueError if it is none."""
    try:
        header = json.loads(safetensors_metadata(data).get("privbert", "{}"))
    except (ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: not a denoiser file ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != DENOISER_FORMAT or \
            header.get("format_version") != DENOISER_FORMAT_VERSION:
        raise ValueError(f"{where}: not a privbert denoiser of format "
                         f"{DENOISER_FORMAT_VERSION}")
    return header


def check_denoiser_meta(meta: dict, mechanism: str, params: dict, bundle_id: str) -> None:
    """ValueError (one line) unless a denoiser's ``meta`` is for exactly this mechanism, η
    and bundle."""
    eta = (params or {}).get("eta")
    if mechanism != meta.get("mechanism"):
        raise ValueError(f"the denoiser was trained for {meta.get('mechanism')}, not "
                         f"{mechanism}")
    want = float(meta["eta"])
    if eta is None or abs(float(eta) - want) > 1e-9 * want:
        raise ValueError(f"the denoiser was trained for eta={want:g}, the payloads use "
                         f"eta={eta}")
    if bundle_id != meta.get("bundle_id"):
        raise ValueError(f"the denoiser was trained for bundle {str(meta.get('bundle_id'))[:12]}"
                         f"…, the payloads use {bundle_id[:12]}…")
    have, sent = meta.get("public_p"), (params or {}).get("public_p")
    if (have is None) != (sent is None) or (have is not None and abs(
            float(have) - float(sent)) > 1e-9):  # type: ignore[arg-type]
        def say(p: float | None) -> str:
            return "no token policy" if p is None else f"token policy public_p={p:g}"
        raise ValueError(f"the denoiser was trained for {say(have)}, the payloads use "
                         f"{say(sent)}")
