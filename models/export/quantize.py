"""Int8 classifiers for ONNX Runtime: ``classifier.int8.onnx`` quantized from a version's
``classifier.onnx`` with ``onnxruntime.quantization`` (needs the ``onnx`` package: the
train extra; serving the result needs only onnxruntime, :mod:`models.export.onnx_classifier`).

Scheme (``DEFAULT_SCHEME``, chosen by ``python -m bench.int8``, bench/results/serving.md):
dynamic quantization of every MatMul and Gather (weights int8 with one scale per output
column, activations uint8 quantized per call from their own range), weights on 7 bits
(``reduce_range``). One scale per tensor lost SST-2 accuracy on the same privatized
inputs where one per column did not; static quantization (activation scales calibrated on
privatized public text) lost more and was no faster: not used (``bench/int8.py``).
Why 7 bits: MLAS multiplies uint8 activations by int8 weights with ``vpmaddubsw`` on x86
CPUs without VNNI (AVX2, AVX-512 without VNNI), which adds the products of two adjacent
coordinates in int16 with saturation: 255 x 127 x 2 = 64,770 > 32,767 gives wrong
results, 255 x 64 x 2 = 32,640 cannot. VNNI kernels (``vpdpbusd``) accumulate in int32
and are exact either way. A 7-bit file is therefore right on every CPU;
:func:`models.export.onnx_classifier.int8_kernel_check` verifies it on the serving CPU anyway,
and refuses a file whose weights the CPU's kernel would saturate.

The file carries, in its metadata, the SHA-256 of the ``classifier.onnx`` it was made
from and the scheme: the serving backend refuses an int8 file made from another
version's ONNX file. ``config.json`` records the scheme and the largest logit difference
to fp32 on random payload-shaped inputs (informational: accuracy on real privatized text
is what ``bench/int8.py`` measures).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx  # the quantizer needs it (train extra); ImportError here = cannot quantize

from models.export.onnx_classifier import META_BUNDLE, META_SCHEME, META_SOURCE, onnx_session
from models.training.data import collate_arrays, example_payload_arrays
from models.versions.manifest import file_sha256, update_manifest
from models.versions.version_folder import CONFIG_FILE, INT8_FILE, ONNX_FILE, read_config


@dataclass(frozen=True)
class QuantScheme:
    """How the int8 file is made. ``weights``: "s8" (int8, symmetric) or "u8" (uint8, with
    a zero point); ``reduce_range``: 7-bit weights (see the module docstring);
    ``per_channel``: one scale per output column; ``method``: "dynamic" (activations
    quantized per call) or "static" (activation scales calibrated beforehand);
    ``embeddings``: the embedding tables int8 too (their lookups are no faster)."""

    method: str = "dynamic"
    weights: str = "s8"
    reduce_range: bool = True
    per_channel: bool = True
    embeddings: bool = True  # also the Gather of the embedding tables (a 4x smaller file)

    def __post_init__(self):
        if self.method not in ("dynamic", "static"):
            raise ValueError(f"method must be dynamic or static, not {self.method!r}")
        if self.weights not in ("s8", "u8"):
            raise ValueError(f"weights must be s8 or u8, not {self.weights!r}")

    @property
    def weight_max(self) -> int:
        """The largest weight magnitude the kernel multiplies (the saturation probe's)."""
        if self.weights == "u8":
            return 255
        return 64 if self.reduce_range else 127

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> QuantScheme:
        return cls(**json.loads(text))


DEFAULT_SCHEME = QuantScheme()


class _QuantizerChatter(logging.Filter):
    """Drops onnxruntime.quantization's INFO lines (one per tensor, logged on the root
    logger), which would fill a retraining job's log tail."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or "onnxruntime" not in record.pathname


@contextmanager
def _quiet_quantizer() -> Iterator[None]:
    chatter, handlers = _QuantizerChatter(), list(logging.getLogger().handlers)
    for h in handlers:
        h.addFilter(chatter)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(chatter)


def quantize_onnx(src: str | os.PathLike, dst: str | os.PathLike,
                  scheme: QuantScheme = DEFAULT_SCHEME, calibration=None,
                  metadata: dict[str, str] | None = None) -> None:
    """Quantize the ONNX classifier ``src`` into ``dst`` by ``scheme``. ``calibration``: an
    ``onnxruntime.quantization.CalibrationDataReader`` (static only). ``metadata`` goes
    into the file's ``metadata_props``."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    wtype = QuantType.QInt8 if scheme.weights == "s8" else QuantType.QUInt8
    with tempfile.TemporaryDirectory(prefix="privbert-quant-") as tmp, _quiet_quantizer():
        pre = Path(tmp) / "pre.onnx"
        # ONNX shape inference + ONNX Runtime's basic graph optimizations (constant
        # folding, the exporter's Reshape/Transpose chains): what the quantizer expects
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        out = Path(tmp) / "int8.onnx"
        if scheme.method == "dynamic":
            quantize_dynamic(pre, out, per_channel=scheme.per_channel,
                             reduce_range=scheme.reduce_range, weight_type=wtype,
                             op_types_to_quantize=["MatMul", "Gather"] if scheme.embeddings
                             else ["MatMul"],
                             extra_options={"MatMulConstBOnly": True})
        else:
            if calibration is None:
                raise ValueError("static quantization needs calibration data")
            quantize_static(pre, out, calibration, quant_format=QuantFormat.QDQ,
                            per_channel=scheme.per_channel, reduce_range=scheme.reduce_range,
                            activation_type=QuantType.QUInt8, weight_type=wtype,
                            op_types_to_quantize=["MatMul"],
                            extra_options={"MatMulConstBOnly": True,
                                           "ActivationSymmetric": False})
        model = onnx.load(str(out))
        props = {**(metadata or {}), META_SCHEME: scheme.to_json()}
        onnx.helper.set_model_props(model, props)
        tmp_dst = Path(dst).with_name(f".{Path(dst).name}.tmp")
        onnx.save(model, str(tmp_dst))
        os.replace(tmp_dst, dst)


def max_logit_difference(model_dir: str | os.PathLike, int8_path: str | os.PathLike,
                         seed: int = 0) -> float:
    """Largest |int8 - fp32| logit on random payload-shaped batches (1, 3 and 7)."""

    cfg = read_config(model_dir)
    fp32 = onnx_session(str(Path(model_dir) / ONNX_FILE), threads=1)
    int8 = onnx_session(str(int8_path), threads=1)
    names = [i.name for i in fp32.get_inputs()]
    rng = np.random.default_rng(seed)
    worst = 0.0
    for n in (1, 3, 7):
        arrays, segs = example_payload_arrays(cfg, rng, n)
        batch = collate_arrays(arrays, segs, cfg["mechanism"], cfg["special_ids"],
                               int(cfg["max_length"]))
        feed = {k: v for k, v in batch.items() if k in names}
        a = fp32.run(["logits"], feed)[0]
        b = int8.run(["logits"], feed)[0]
        worst = max(worst, float(np.abs(a - b).max()))
    return worst


def quantize_classifier(model_dir: str | os.PathLike, scheme: QuantScheme = DEFAULT_SCHEME,
                        calibration=None) -> Path:
    """Write ``classifier.int8.onnx`` next to ``classifier.onnx`` in a model version folder
    and record it in ``config.json`` (``onnx_int8``). Returns its path."""
    d = Path(model_dir)
    cfg = read_config(d)
    src = d / ONNX_FILE
    if not src.is_file():
        raise ValueError(f"{d}: no {ONNX_FILE} to quantize (export it first: cloud-api "
                         f"export-bundle --onnx --model {d})")
    source = file_sha256(src)
    path = d / INT8_FILE
    quantize_onnx(src, path, scheme, calibration,
                  {META_SOURCE: source, META_BUNDLE: str(cfg["bundle_id"])})
    diff = max_logit_difference(d, path)
    cfg = read_config(d)
    cfg["onnx_int8"] = {"file": INT8_FILE, "source_sha256": source,
                        "scheme": json.loads(scheme.to_json()),
                        "random_inputs_max_abs_logit_diff": diff}
    tmp = d / f".{CONFIG_FILE}.tmp"
    tmp.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, d / CONFIG_FILE)
    update_manifest(d, [INT8_FILE, CONFIG_FILE])  # a sealed version stays whole
    return path


def has_current_int8(model_dir: str | os.PathLike) -> bool:
    """Whether the folder's int8 file was made from its present ``classifier.onnx`` (the
    source hash in the int8 file's metadata)."""
    d = Path(model_dir)
    if not (d / INT8_FILE).is_file() or not (d / ONNX_FILE).is_file():
        return False
    try:
        props = {p.key: p.value for p in onnx.load(str(d / INT8_FILE)).metadata_props}
    except Exception:  # a broken file is not current
        return False
    return props.get(META_SOURCE) == file_sha256(d / ONNX_FILE)
