"""A model version served by onnxruntime on CPU (its ``classifier.onnx``), without torch.

``models.export.export_classifier_onnx`` writes the file (with torch); this module only
reads it, so that the onnx serving backend runs in an image without torch. Only
:meth:`OnnxClassifier.predict_proba` (a convenience for checks and benchmarks) checks
payloads with :class:`models.registry.ModelVersion` and so imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from models.data import collate_payloads
from models.version_folder import ONNX_FILE, read_config


def onnx_session(data: bytes | str, threads: int | None = None):
    """A CPU onnxruntime session; ``threads``: its intra-op thread count (inter-op 1),
    None: onnxruntime's default."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


class OnnxClassifier:
    """A model version served by onnxruntime on CPU (``classifier.onnx``); ``threads``:
    the session's intra-op thread count (inter-op 1), None: onnxruntime's default (every
    core)."""

    def __init__(self, model_dir: str | os.PathLike, threads: int | None = None):
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive int or None, not {threads!r}")
        self.path = Path(model_dir)
        self.config = read_config(self.path)
        if not (self.path / ONNX_FILE).is_file():
            raise ValueError(f"{self.path}: no {ONNX_FILE} (run cloud-api export-bundle --onnx "
                             f"--model {self.path})")
        self.session = onnx_session(str(self.path / ONNX_FILE), threads)
        self.input_names = [i.name for i in self.session.get_inputs()]

    def logits(self, batch: dict) -> np.ndarray:
        """Logits (B, C) for a collated batch (numpy arrays or CPU torch tensors)."""
        feed = {k: np.asarray(v) for k, v in batch.items() if k in self.input_names}
        return self.session.run(["logits"], feed)[0]

    def predict_proba(self, payloads: Sequence) -> np.ndarray:
        """Class probabilities (N, C) for payloads (checked like the torch model's)."""
        from torch import nn

        from models.registry import ModelVersion

        shell = ModelVersion(self.path, self.config, {}, nn.Identity())
        for p in payloads:
            shell.check_payload(p)
        z = self.logits(collate_payloads(payloads, self.config, as_numpy=True))
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)
