"""Fixtures for models/: a tiny randomly initialised BERT folder, its bundle, and payloads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shared.payload import Record, make_payload
from tests.conftest import TINY_WORDS

POSITIVE = ["good", "great", "fun", "funny", "love"]
NEGATIVE = ["bad", "awful", "dull", "boring", "hate"]
NEUTRAL = ["the", "a", "movie", "film", "plot", "actor", "story", "it", "this", "was", "is"]


def make_full_tiny_bert(path: Path, dim: int = 16, seed: int = 0, layers: int = 2) -> Path:
    """A complete Hugging Face BERT folder (every weight) with the tiny test vocabulary."""
    import torch
    from transformers import BertConfig, BertModel

    vocab = ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]",
             "[MASK]", *TINY_WORDS]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=dim, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * dim,
                        max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertModel(config)
    with torch.no_grad():  # spread the table so that tokens are distinguishable
        model.embeddings.word_embeddings.weight.normal_(0.0, 0.5)
    model.save_pretrained(str(path))
    return path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return make_full_tiny_bert(tmp_path_factory.mktemp("tiny-full-bert"))


@pytest.fixture(scope="session")
def tiny_bert_bundle(tiny_bert_dir):
    from shared.bundle import EdgeBundle

    return EdgeBundle.from_model(tiny_bert_dir)


def sentiment_texts(n: int, seed: int = 0, pairs: bool = False):
    """Synthetic sentences: label 1 iff a positive word is in it (labels "neg"/"pos")."""
    rng = np.random.default_rng(seed)
    texts, second, labels = [], [], []
    for i in range(n):
        y = i % 2
        words = list(rng.choice(NEUTRAL, size=rng.integers(2, 6)))
        words.insert(int(rng.integers(0, len(words) + 1)), str(rng.choice(
            POSITIVE if y else NEGATIVE)))
        texts.append(" ".join(words))
        second.append(" ".join(rng.choice(NEUTRAL, size=rng.integers(1, 4))))
        labels.append("pos" if y else "neg")
    return texts, (second if pairs else None), labels


def ids_of(bundle, text: str) -> np.ndarray:
    return np.asarray(bundle.tokenizer.encode(text, add_special_tokens=False).ids)


def token_records(bundle, mechanism: str, texts, labels, pairs=None, eta: float = 1e4,
                  seed: int = 0) -> list[Record]:
    """Records of a token kind built directly with shared.mechanisms (no edge agent)."""
    from shared.mechanisms import DChiEmbedding, DChiText

    rng = np.random.default_rng(seed)
    out = []
    mech = {"dchi-text": lambda: DChiText(bundle, eta), "dchi-embedding":
            lambda: DChiEmbedding(eta), "none": lambda: None}[mechanism]()
    for i, (t, y) in enumerate(zip(texts, labels, strict=True)):
        ids = ids_of(bundle, t)
        seg = None
        if pairs is not None:
            ib = ids_of(bundle, pairs[i])
            seg = [len(ids), len(ib)]
            ids = np.concatenate([ids, ib])
        if mechanism == "dchi-text":
            data, params = mech.privatize_ids(ids, rng), mech.params
        elif mechanism == "dchi-embedding":
            data, params = mech.privatize(bundle.embeddings[ids], rng), mech.params
        else:
            data, params = ids, {}
        out.append(Record(payload=make_payload(mechanism, params, bundle.bundle_id, data, seg),
                          label=y))
    return out


def vector_records(bundle_id: str, mechanism: str, n: int, dim: int = 24, seed: int = 0,
                   n_labels: int = 2) -> list[Record]:
    """Vector-kind records from class-dependent Gaussian vectors through shared.mechanisms."""
    from shared.mechanisms import OME, Laplace, TextHide

    rng = np.random.default_rng(seed)
    y = np.arange(n) % n_labels
    centres = rng.normal(0, 1, (n_labels, dim))
    vecs = centres[y] * 2.0 + rng.normal(0, 0.5, (n, dim))
    if mechanism == "laplace":
        mech = Laplace(epsilon=1e3, calibration="coordinate")
        data, labels = mech.privatize(vecs, rng), [int(v) for v in y]
    elif mechanism == "ome":
        mech = OME(epsilon=1e3, lam=100.0, dim=dim)
        data, labels = mech.privatize(vecs, rng), [int(v) for v in y]
    else:
        mech = TextHide(m=4, k=2, dim=dim, seed=1)
        data, soft = mech.encrypt(vecs, np.eye(n_labels)[y], rng)
        labels = [list(map(float, s)) for s in soft]
    return [Record(payload=make_payload(mechanism, mech.params, bundle_id, d), label=lab)
            for d, lab in zip(data, labels, strict=True)]


@pytest.fixture(scope="session")
def tiny_encoder_bundle(tiny_bert_dir, tmp_path_factory):
    """The tiny BERT's bundle with encoder.onnx (export_bundle), for laplace/ome/texthide."""
    from models.export import export_bundle

    return export_bundle(tmp_path_factory.mktemp("tiny-bundle") / "bundle", tiny_bert_dir)


def write_tsv(path: Path, texts, labels, pairs=None) -> Path:
    """A labelled TSV in the format of ``cloud-api train --data``."""
    if pairs is None:
        rows = ["sentence\tlabel"] + [f"{t}\t{y}" for t, y in zip(texts, labels, strict=True)]
    else:
        rows = ["sentence_a\tsentence_b\tlabel"] + [
            f"{a}\t{b}\t{y}" for a, b, y in zip(texts, pairs, labels, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    return path
