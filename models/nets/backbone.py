"""The BERT backbone every model starts from, its frozen word embeddings, and the device.

The word-embedding table is the edge's (it is in the bundle): it is frozen in every
model and must stay bit-identical to ``bundle.embeddings``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from shared.bundle import EdgeBundle, default_model_dir
from shared.table import table_digest


def pick_device(flag: str = "auto") -> torch.device:
    """"auto" = CUDA when present, else CPU; or an explicit "cpu" / "cuda" / "cuda:1"."""
    if flag == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(flag)
    except RuntimeError:
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {flag!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA GPU is available")
    return dev


def autocast_dtype(device: torch.device, flag: str = "auto") -> torch.dtype | None:
    """Mixed precision: "auto" = bf16 on a CUDA GPU that supports it, else fp16 on CUDA,
    none on CPU; or "bf16" / "fp16" / "fp32" (none)."""
    if flag == "fp32":
        return None
    if flag == "bf16":
        return torch.bfloat16
    if flag == "fp16":
        return torch.float16
    if flag != "auto":
        raise ValueError(f"precision must be auto, bf16, fp16 or fp32, got {flag!r}")
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def resolve_model_dir(model_dir: str | os.PathLike | None) -> Path:
    """A Hugging Face BERT folder; None = the default MiniLM-L6-H384."""
    return default_model_dir() if model_dir is None else Path(model_dir)


def load_bert(model_dir: str | os.PathLike | None = None):
    """``transformers.BertModel`` from a local folder (never downloads)."""
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    path = resolve_model_dir(model_dir)
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: not a BERT folder (no config.json)")
    hf_logging.disable_progress_bar()
    return BertModel.from_pretrained(str(path), local_files_only=True)


def freeze_word_embeddings(bert) -> None:
    """No gradient into the word-embedding table (it is the edge's)."""
    bert.embeddings.word_embeddings.weight.requires_grad_(False)


def check_same_bundle(bert, bundle: EdgeBundle) -> None:
    """Raise ValueError unless ``bert``'s word embeddings are the bundle's, bit for bit; for
    a bundle with a designed privatization table, the table its projection was built from
    (the SHA-256 of ``shared.table`` provenance)."""
    w = bert.embeddings.word_embeddings.weight.detach().cpu().numpy()
    if not bundle.has_embeddings:
        source = bundle.table_info.get("source") or {}
        if w.shape[0] != bundle.vocab_size or table_digest(w) != source.get("sha256"):
            raise ValueError(f"the bundle's privatization table ({bundle.table_name}) was not "
                             f"built from this model's word embeddings {tuple(w.shape)} "
                             f"(bundle {bundle.bundle_id[:12]}…): build it from this model "
                             "(cloud-api export-bundle --model-dir DIR --table NAME)")
        return
    if w.shape != bundle.embeddings.shape:
        raise ValueError(f"checkpoint word embeddings {w.shape} do not match the bundle's "
                         f"{bundle.embeddings.shape} (another vocabulary or dimension)")
    if not np.array_equal(w, bundle.embeddings):
        raise ValueError("checkpoint word embeddings differ from the bundle's: it was trained "
                         f"for another bundle (expected {bundle.bundle_id[:12]}…)")


def keep_layers(bert, n: int) -> None:
    """Keep the first ``n`` transformer layers of ``bert`` (a smaller, faster model whose
    lower layers are the pretrained ones; Sajjad et al. 2023 "On the effect of dropping
    layers of pre-trained transformer models"). ValueError if it has fewer."""
    have = len(bert.encoder.layer)
    if not 1 <= n <= have:
        raise ValueError(f"--layers {n}: the base BERT has {have} layers")
    bert.encoder.layer = bert.encoder.layer[:n]
    bert.config.num_hidden_layers = n


def model_embeddings(bundle: EdgeBundle, model_dir: str | os.PathLike | None = None
                     ) -> np.ndarray:
    """The model-space word embeddings (vocab × n) that go with ``bundle``: its own, or for a
    bundle with a designed privatization table, the base model's (``model_dir``, None = the
    default MiniLM), checked against the digest in the table's provenance."""
    if bundle.has_embeddings:
        return bundle.embeddings
    emb = EdgeBundle.from_model(model_dir).embeddings
    if table_digest(emb) != (bundle.table_info.get("source") or {}).get("sha256"):
        raise ValueError(f"the bundle's privatization table ({bundle.table_name}) was not built "
                         f"from the word embeddings of {resolve_model_dir(model_dir)}")
    return emb
