"""A model version folder's file names and its ``config.json``, without torch.

The layout is described in :mod:`models.registry` (which writes and loads the weights with
torch); this module is what a torch-free reader needs: the onnx serving backend
(:mod:`models.onnx_classifier`) and ``cloud_api.serving``.
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
INT8_FILE = "classifier.int8.onnx"  # models.quantize


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
