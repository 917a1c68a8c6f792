"""Fixtures for models/: a tiny randomly initialised BERT folder, its bundle, and payloads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shared.payload import Record, make_payload
from tests.conftest import TINY_WORDS, make_full_tiny_bert  # noqa: F401 (re-exported)

POSITIVE = ["good", "great", "fun", "funny", "love"]
NEGATIVE = ["bad", "awful", "dull", "boring", "hate"]
NEUTRAL = ["the", "a", "movie", "film", "plot", "actor", "story", "it", "this", "was", "is"]


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread):
    """Every test here runs torch on one thread (tests/conftest.py: one_torch_thread)."""
    yield


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
    from models.export.writers import export_bundle

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
