"""A model version served by onnxruntime on CPU (its ``classifier.onnx``, or the int8
``classifier.int8.onnx``), without torch.

``models.export.writers.export_classifier_onnx`` writes the fp32 file (with torch) and
``models.export.quantize`` the int8 one (with the ``onnx`` package); this module only reads
them, so that the onnx serving backends run in an image without either. Only
:meth:`OnnxClassifier.predict_proba` (a convenience for checks and benchmarks) checks
payloads with :class:`models.versions.model_version.ModelVersion` and so imports torch.

An int8 file is loaded only after two checks (:class:`Int8Refused` says which failed):
it was made from this version's ``classifier.onnx`` (its metadata names that file's
SHA-256), and the integer kernel this CPU runs is exact for the file's weight range
(:func:`int8_kernel_check`: MLAS's u8 x s8 kernel without VNNI saturates int16 pair
sums; see ``models.export.quantize``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from models.training.data import collate_payloads
from models.versions.manifest import file_sha256
from models.versions.version_folder import INT8_FILE, ONNX_FILE, read_config
from shared.mechanisms.int8_pass import VNNI_FLAGS, cpu_flags
from shared.mechanisms.onnx_graph import one_node_model, value_info

META_SOURCE = "privbert.source_sha256"  # the int8 file's metadata (models.export.quantize)
META_SCHEME = "privbert.int8_scheme"
META_BUNDLE = "privbert.bundle_id"


class Int8Refused(ValueError):
    """An int8 file that must not be served here (the message says why)."""


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


def _probe_model(weights: str, weight: int, dim: int, cols: int) -> bytes:
    """DynamicQuantizeMatMul (the op ONNX Runtime fuses a dynamically quantized MatMul
    into) with every weight ``weight`` (s8 or u8, zero point 0) and scale 1/weight."""
    wtype = np.int8 if weights == "s8" else np.uint8
    return one_node_model(
        "DynamicQuantizeMatMul", "com.microsoft", ["A", "B", "b_scale", "b_zp"], ["O"],
        [value_info("A", np.float32, ("m", dim))], [value_info("O", np.float32, ("m", cols))],
        {"B": np.full((dim, cols), weight, wtype),
         "b_scale": np.array(1.0 / weight, np.float32), "b_zp": np.array(0, wtype)},
        {"": 13, "com.microsoft": 1})


def int8_kernel_check(weights: str = "s8", weight_max: int = 127, dim: int = 64) -> dict:
    """Run ONNX Runtime's integer GEMM on this CPU at the extremes of an int8 file's range:
    activations quantized to 255 (all ones) times weights of ``weight_max``. The exact
    answer is ``dim`` for each output; a kernel that saturates int16 pair sums returns
    about half. Checked for one row and for a batch (different kernel paths).

    Returns ``{"exact": bool, "vnni": bool, "isa": [...], "weights", "weight_max", "got"}``:
    which kernel runs is not assumed from the flags, the flags are reported beside it."""
    flags = cpu_flags()
    sess = onnx_session(_probe_model(weights, weight_max, dim, 16), 1)
    got = []
    for rows in (1, 8):
        out = sess.run(["O"], {"A": np.ones((rows, dim), np.float32)})[0]
        got.append(float(np.abs(out - dim).max()))
    isa = sorted(f for f in flags if f in ("avx2", "avx512f", "avx512bw", *VNNI_FLAGS,
                                           "asimddp", "i8mm"))
    return {"exact": max(got) <= 1e-3 * dim, "vnni": bool(flags & VNNI_FLAGS),
            "isa": isa, "weights": weights, "weight_max": weight_max,
            "max_abs_error": max(got)}


_KERNEL_CHECKS: dict[tuple[str, int], dict] = {}


def int8_kernel_check_cached(weights: str, weight_max: int) -> dict:
    """:func:`int8_kernel_check`, once per process and range."""
    key = (weights, weight_max)
    if key not in _KERNEL_CHECKS:
        _KERNEL_CHECKS[key] = int8_kernel_check(weights, weight_max)
    return _KERNEL_CHECKS[key]


def int8_scheme_of(session) -> dict:
    """The scheme recorded in an int8 session's file metadata ({} when there is none)."""
    import json

    meta = session.get_modelmeta().custom_metadata_map
    try:
        return json.loads(meta.get(META_SCHEME, "{}"))
    except ValueError:
        return {}


class OnnxClassifier:
    """A model version served by onnxruntime on CPU (``classifier.onnx``; with ``int8``,
    ``classifier.int8.onnx``, checked as the module docstring says); ``threads``: the
    session's intra-op thread count (inter-op 1), None: onnxruntime's default (every
    core)."""

    def __init__(self, model_dir: str | os.PathLike, threads: int | None = None,
                 int8: bool = False):
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive int or None, not {threads!r}")
        self.path = Path(model_dir)
        self.config = read_config(self.path)
        self.int8 = int8
        self.kernel: dict | None = None
        name = INT8_FILE if int8 else ONNX_FILE
        if not (self.path / name).is_file():
            how = (f"quantize it: cloud-api export-bundle --onnx --model {self.path}" if int8
                   else f"run cloud-api export-bundle --onnx --model {self.path}")
            raise ValueError(f"{self.path}: no {name} ({how})")
        self.session = onnx_session(str(self.path / name), threads)
        if int8:
            self.kernel = self._check_int8()
        self.input_names = [i.name for i in self.session.get_inputs()]

    def _check_int8(self) -> dict:
        """Int8Refused unless the file belongs to this version and this CPU's kernel is
        exact on its weight range; the kernel check's report otherwise."""
        meta = self.session.get_modelmeta().custom_metadata_map
        source = meta.get(META_SOURCE)
        fp32 = self.path / ONNX_FILE
        want = file_sha256(fp32) if fp32.is_file() else \
            (self.config.get("onnx_int8") or {}).get("source_sha256")
        where = self.path / INT8_FILE
        if source is None:
            raise Int8Refused(f"{where}: not made by privbert's quantizer (no {META_SOURCE} "
                              "in its metadata)")
        if source != want or meta.get(META_BUNDLE) != self.config["bundle_id"]:
            raise Int8Refused(f"{where} was quantized from another classifier.onnx than "
                              f"this version's (sha256 {source[:12]}… in the file, "
                              f"{str(want)[:12]}… here): quantize it again")
        scheme = int8_scheme_of(self.session)
        weights = scheme.get("weights", "s8")
        wmax = 255 if weights == "u8" else (64 if scheme.get("reduce_range") else 127)
        kernel = int8_kernel_check_cached(weights, wmax)
        if not kernel["exact"]:
            raise Int8Refused(
                f"{where}: this CPU's integer kernel saturates on its weights ({weights}, "
                f"up to {wmax}; CPU {'with' if kernel['vnni'] else 'without'} VNNI, error "
                f"{kernel['max_abs_error']:.3g} on the probe): quantize with reduce_range "
                "(models.export.quantize's default)")
        return {**kernel, "scheme": scheme}

    def logits(self, batch: dict) -> np.ndarray:
        """Logits (B, C) for a collated batch (numpy arrays or CPU torch tensors)."""
        feed = {k: np.asarray(v) for k, v in batch.items() if k in self.input_names}
        return self.session.run(["logits"], feed)[0]

    def predict_proba(self, payloads: Sequence) -> np.ndarray:
        """Class probabilities (N, C) for payloads (checked like the torch model's)."""
        # lazy: torch, only for a torch-checked prediction (the onnx backend has none)
        from torch import nn

        from models.versions.model_version import ModelVersion

        shell = ModelVersion(self.path, self.config, {}, nn.Identity())
        for p in payloads:
            shell.check_payload(p)
        z = self.logits(collate_payloads(payloads, self.config, as_numpy=True))
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)
