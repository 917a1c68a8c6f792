"""Export: the edge bundle with its frozen sentence encoder, and classifiers for ONNX Runtime.

Encoder (the bundle's ``encoder.onnx``, ARCHITECTURE.md "The edge bundle"; the edge reads
it with ``edge_agent.privatize.encoder``): inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` int64
[batch, seq]; output ``sentence_embedding`` float32 [batch, r]. Pooling "mean" = mean of
the last hidden states over the attention mask (MiniLM's sentence-transformers pooling,
without its final L2 normalisation), or "cls" = the last hidden state of [CLS]. Each
export is run with onnxruntime and compared with torch on real sentences (max absolute
difference <= 1e-4), each sentence alone in torch and padded in a batch in ONNX.

Classifier: the ``forward`` of the trained module, inputs named as the keys of
:func:`models.training.data.collate`, output ``logits`` [batch, C], written as ``classifier.onnx``
into the model folder, and its int8 version ``classifier.int8.onnx`` (``models.export.quantize``);
:class:`OnnxClassifier` serves either on CPU.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.export.onnx_classifier import onnx_session
from models.nets.backbone import load_bert, resolve_model_dir
from models.nets.classifiers import (
    POOLINGS,
    EmbeddingClassifier,
    TokenClassifier,
    VectorMLP,
    mean_pool,
)
from models.training.data import collate, example_payload_arrays, fit_segments
from models.versions.manifest import update_manifest
from models.versions.model_version import load_model
from models.versions.version_folder import CONFIG_FILE, ONNX_FILE
from shared.bundle import EdgeBundle, save_atomically

OPSET = 18
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
ENCODER_OUTPUT = "sentence_embedding"
TOLERANCE = 1e-4
CHECK_SENTENCES = (
    "the emotions are raw and will strike a nerve",
    "a gorgeous, witty, seductive movie.",
    "it's a bad sign when you're rooting for the film to end.",
    "hide new secretions from the parental units",
    "unflinchingly bleak and desperate",
    "the acting, costumes, music, cinematography and sound are all astounding given the "
    "production's austere locales.",
    "ok",
    "Stocks rallied on Wall Street on Friday as oil prices fell and investors bet that the "
    "central bank would hold interest rates steady through the end of the year.",
)
CHECK_PAIR = ("How do I learn Python quickly?", "What is the fastest way to learn Python?")


class SentenceEncoder(nn.Module):
    """The frozen sentence encoder of the edge: BERT plus pooling, in eval mode."""

    def __init__(self, bert, pooling: str = "mean"):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.bert, self.pooling = bert, pooling

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                      token_type_ids=token_type_ids).last_hidden_state
        if self.pooling == "mean":
            return mean_pool(h, attention_mask)
        return h[:, 0]


def encoder_inputs(bundle: EdgeBundle, texts: Sequence[str], pairs: Sequence[str] | None = None,
                   max_length: int = 128) -> dict[str, np.ndarray]:
    """Padded int64 encoder inputs ``[CLS] a [SEP] (b [SEP])`` (truncating a, then b)."""
    sp = bundle.special_ids
    rows = []
    for i, text in enumerate(texts):
        a = bundle.tokenizer.encode(text, add_special_tokens=False).ids
        b = bundle.tokenizer.encode(pairs[i], add_special_tokens=False).ids if pairs else None
        if b is None:
            a = a[: max_length - 2]
            ids, tt = [sp["cls"], *a, sp["sep"]], [0] * (len(a) + 2)
        else:

            la, lb = fit_segments(len(a), len(b), max_length - 3)
            a, b = a[:la], b[:lb]
            ids = [sp["cls"], *a, sp["sep"], *b, sp["sep"]]
            tt = [0] * (la + 2) + [1] * (lb + 1)
        rows.append((ids, tt))
    t = max(len(r[0]) for r in rows)
    out = {k: np.zeros((len(rows), t), dtype=np.int64) for k in ENCODER_INPUTS}
    out["input_ids"][:] = sp["pad"]
    for i, (ids, tt) in enumerate(rows):
        out["input_ids"][i, : len(ids)] = ids
        out["attention_mask"][i, : len(ids)] = 1
        out["token_type_ids"][i, : len(ids)] = tt
    return out


def onnx_bytes(module: nn.Module, example: dict[str, torch.Tensor], output: str,
               dynamic: dict[str, dict[int, str]]) -> bytes:
    """Export ``module`` with torch.onnx (dynamo exporter, opset 18) to bytes. ``example``
    lists the inputs in the order of ``module.forward``'s parameters; ``dynamic`` names the
    dynamic axes of each input."""
    names = list(example)
    dims: dict[str, torch.export.Dim] = {}
    shapes = {n: {ax: dims.setdefault(d, torch.export.Dim(d)) for ax, d in dynamic.get(n, {}
                                                                                   ).items()}
              for n in names}

    sink = io.StringIO()
    log = logging.getLogger("torch.onnx")
    level = log.level
    log.setLevel(logging.ERROR)  # "torchvision is not installed" and progress chatter
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink):
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(
                module.eval(), tuple(example[n] for n in names), None, input_names=names,
                output_names=[output], opset_version=OPSET, dynamo=True, verbose=False,
                external_data=False, dynamic_shapes=tuple(shapes[n] for n in names))
    finally:
        log.setLevel(level)
    if prog is None:  # dynamo=True always returns the program
        raise RuntimeError("torch.onnx.export returned no ONNX program")
    return prog.model_proto.SerializeToString()


def check_encoder(onnx_data: bytes, encoder: SentenceEncoder, bundle: EdgeBundle,
                  texts: Sequence[str] = CHECK_SENTENCES) -> float:
    """Max |ONNX - torch| over ``texts`` (padded batch in ONNX, one by one in torch) and a
    sentence pair; ValueError above 1e-4."""
    sess = onnx_session(onnx_data)
    batch = encoder_inputs(bundle, texts)
    got = sess.run([ENCODER_OUTPUT], batch)[0]
    want = []
    with torch.no_grad():
        for t in texts:
            one = encoder_inputs(bundle, [t])
            want.append(encoder(**{k: torch.from_numpy(v) for k, v in one.items()}).numpy()[0])
        pair = encoder_inputs(bundle, [CHECK_PAIR[0]], [CHECK_PAIR[1]])
        want_pair = encoder(**{k: torch.from_numpy(v) for k, v in pair.items()}).numpy()
    got_pair = sess.run([ENCODER_OUTPUT], pair)[0]
    diff = max(float(np.abs(got - np.stack(want)).max()), float(np.abs(got_pair - want_pair
                                                                         ).max()))
    if got.dtype != np.float32 or not diff <= TOLERANCE:
        raise ValueError(f"ONNX encoder differs from torch by {diff:.2e} (> {TOLERANCE:g})")
    return diff


def export_encoder_onnx(model_dir: str | os.PathLike | None = None, pooling: str = "mean",
                        bundle: EdgeBundle | None = None) -> tuple[bytes, dict]:
    """ONNX bytes of the frozen sentence encoder of ``model_dir`` (None = MiniLM) and its
    description for ``bundle.meta["encoder"]`` (checked against torch)."""
    bert = load_bert(model_dir).eval()
    encoder = SentenceEncoder(bert, pooling).eval()
    bundle = bundle or EdgeBundle.from_model(model_dir)
    example = {k: torch.from_numpy(v) for k, v in
               encoder_inputs(bundle, CHECK_SENTENCES[:2]).items()}
    if int(example["attention_mask"].min()) != 0:  # trace with padding: no specialisation
        raise RuntimeError("the ONNX export example must contain padding")
    dyn = {k: {0: "batch", 1: "seq"} for k in ENCODER_INPUTS}
    data = onnx_bytes(encoder, example, ENCODER_OUTPUT, dyn)
    diff = check_encoder(data, encoder, bundle)
    desc = {"pooling": pooling, "output_dim": int(bert.config.hidden_size),
            "max_length": int(bert.config.max_position_embeddings),
            "inputs": list(ENCODER_INPUTS), "output": ENCODER_OUTPUT, "opset": OPSET,
            "normalized": False, "checked_max_abs_diff": diff,
            "source": str(resolve_model_dir(model_dir).name)}
    return data, desc


def export_bundle(out_dir: str | os.PathLike, model_dir: str | os.PathLike | None = None,
                  pooling: str = "mean") -> EdgeBundle:
    """Write the edge bundle of ``model_dir`` (None = MiniLM) with ``encoder.onnx`` to
    ``out_dir`` (atomically) and return it."""
    bundle = EdgeBundle.from_model(model_dir)
    data, desc = export_encoder_onnx(model_dir, pooling, bundle)
    full = bundle.with_encoder(data, desc)
    save_atomically(full, out_dir)
    return EdgeBundle.load(out_dir, expected_id=full.bundle_id)


# -- classifiers -----------------------------------------------------------------------------
def export_classifier_onnx(model_dir: str | os.PathLike, seed: int = 0, int8: bool = True
                           ) -> Path:
    """Write ``classifier.onnx`` into a trained model folder; checked against torch on random
    payload-shaped batches (max |logit difference| <= 1e-4); with ``int8`` also
    ``classifier.int8.onnx`` (``models.export.quantize.quantize_classifier``). Returns the fp32
    file's path."""

    mv = load_model(model_dir)
    module = mv.module.float().eval()
    if not isinstance(module, TokenClassifier | EmbeddingClassifier | VectorMLP):
        raise TypeError(f"not a privbert classifier: {type(module).__name__}")
    rng = np.random.default_rng(seed)
    arrays, segs = example_payload_arrays(mv.config, rng)
    example = collate(arrays, segs, mv.mechanism, mv.special_ids, mv.max_length)
    example = {k: example[k] for k in module.input_names}
    dyn = {k: ({0: "batch", 1: "seq"} if v.ndim >= 2 and k != "features" else {0: "batch"})
           for k, v in example.items()}
    data = onnx_bytes(module, example, "logits", dyn)
    sess = onnx_session(data)
    worst = 0.0
    for n in (1, 3, 7):
        arrays, segs = example_payload_arrays(mv.config, rng, n)
        batch = collate(arrays, segs, mv.mechanism, mv.special_ids, mv.max_length)
        batch = {k: batch[k] for k in module.input_names}
        got = sess.run(["logits"], {k: v.numpy() for k, v in batch.items()})[0]
        with torch.no_grad():
            want = module(**batch).numpy()
        worst = max(worst, float(np.abs(got - want).max()))
    if not worst <= TOLERANCE:
        raise ValueError(f"ONNX classifier differs from torch by {worst:.2e} (> {TOLERANCE:g})")
    path = Path(model_dir) / ONNX_FILE
    tmp = path.with_name(f".{ONNX_FILE}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    cfg_path = Path(model_dir) / CONFIG_FILE
    cfg = json.loads(cfg_path.read_text())
    cfg["onnx"] = {"file": ONNX_FILE, "inputs": list(module.input_names), "output": "logits",
                   "opset": OPSET, "checked_max_abs_diff": worst}
    tmp_cfg = cfg_path.with_name(f".{CONFIG_FILE}.tmp")
    tmp_cfg.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    os.replace(tmp_cfg, cfg_path)
    update_manifest(model_dir, [ONNX_FILE, CONFIG_FILE])  # a sealed version stays whole
    if int8:
        # lazy: onnx, only with int8
        from models.export.quantize import quantize_classifier

        quantize_classifier(model_dir)
    return path
