"""The crafted bundles of issue 42, built from the public model: a hostile server chooses
both the tokenizer and the table, keeps a valid bundle id and the genuine diameter (so the
printed guarantee looks normal), and makes the rows that text uses safe for itself while
the vocabulary as a whole looks honest to the uniform floor.

* :func:`frequent_isolated`: the 3,000 most frequent word pieces placed far from every
  other row (the other rows drawn together toward the centre): text comes back unchanged;
* :func:`char_tokenizer`: a tokenizer that falls back to single characters (every other
  piece renamed out of reach) whose rows are isolated: text reads back verbatim;
* :func:`groups_of_four`: rows in groups of 4, each group named by one frequent piece
  (its three other members rare pieces), groups far apart: a quarter comes back
  unchanged, but every output names its group and the server decodes nearly all.

"Frequent" is the order of the WordPiece vocabulary (BERT's ids from 1,996 are its words
by decreasing frequency, "the" first), after the punctuation: no data set is read.
"""

from __future__ import annotations

import json

import numpy as np

from shared.bundle import EdgeBundle

FREQUENT = 3000
_PUNCT = ".,'!?;:-()\""


def frequent_ids(bundle: EdgeBundle, n: int = FREQUENT) -> np.ndarray:
    """The ``n`` most frequent pieces of a BERT WordPiece vocabulary: punctuation, then
    the words from "the" in the vocabulary's order."""
    vocab = bundle.tokenizer.get_vocab()
    punct = [vocab[c] for c in _PUNCT if c in vocab]
    start = vocab.get("the", 0)
    regular = set(bundle.regular_ids.tolist())
    words = [i for i in range(start, bundle.vocab_size) if i in regular and i not in punct]
    return np.array((punct + words)[:n], dtype=np.int64)


def _directions(n: int, dim: int, seed: int) -> np.ndarray:
    u = np.random.default_rng(seed).standard_normal((n, dim))
    return u / np.linalg.norm(u, axis=1, keepdims=True)


def _crafted(bundle: EdgeBundle, table: np.ndarray, tokenizer_json: str | None = None
             ) -> EdgeBundle:
    """A bundle with this table (and tokenizer), the genuine diameter and a valid id."""
    meta = {k: v for k, v in bundle.meta.items() if k not in ("files", "bundle_id")}
    return EdgeBundle(tokenizer_json or bundle._tokenizer_json, table.astype(np.float32), meta)


def _isolate(bundle: EdgeBundle, rows: np.ndarray, shrink: float, seed: int) -> np.ndarray:
    """The model's table with ``rows`` on the sphere of the table's largest norm (one
    random direction each) and every other regular row drawn toward the centre by
    ``shrink``; the row of largest norm keeps it, so the diameter is the genuine one."""
    emb = np.array(bundle.embeddings, dtype=np.float64)
    reg = np.asarray(bundle.regular_ids)
    norms = np.linalg.norm(emb[reg], axis=1)
    t_max, top = float(norms.max()), int(reg[norms.argmax()])
    others = np.setdiff1d(reg, rows)
    emb[others] *= shrink
    emb[rows] = _directions(rows.size, emb.shape[1], seed) * (t_max * 0.999)
    emb[top] = emb[top] / np.linalg.norm(emb[top]) * t_max
    return emb


def frequent_isolated(bundle: EdgeBundle, n: int = FREQUENT) -> EdgeBundle:
    return _crafted(bundle, _isolate(bundle, frequent_ids(bundle, n), 0.35, 1))


def char_tokenizer(bundle: EdgeBundle) -> EdgeBundle:
    """Every piece longer than one character (or ``##`` and one) renamed out of reach: the
    WordPiece model then falls back to single characters, whose rows are isolated."""
    doc = json.loads(bundle._tokenizer_json)
    vocab: dict[str, int] = doc["model"]["vocab"]
    special = set(bundle.special_ids.values()) | set(bundle.meta["unused_ids"])
    kept = []
    renamed = {}
    for piece, i in vocab.items():
        body = piece[2:] if piece.startswith("##") else piece
        if i in special or len(body) == 1:
            renamed[piece] = i
            if i not in special:
                kept.append(i)
        else:
            renamed[f"\x00{i}"] = i  # no text word contains a NUL
    doc["model"]["vocab"] = renamed
    emb = _isolate(bundle, np.array(sorted(kept), dtype=np.int64), 0.35, 2)
    return _crafted(bundle, emb, json.dumps(doc, ensure_ascii=False))


def groups_of_four(bundle: EdgeBundle, n: int = FREQUENT, spread: float = 0.1) -> EdgeBundle:
    """Group g: frequent piece g and three of the rarest pieces, their rows within
    ``spread`` of one centre on the sphere of the largest norm; other rows drawn in."""
    emb = np.array(bundle.embeddings, dtype=np.float64)
    reg = np.asarray(bundle.regular_ids)
    norms = np.linalg.norm(emb[reg], axis=1)
    t_max, top = float(norms.max()), int(reg[norms.argmax()])
    head = frequent_ids(bundle, n)
    taken = set(head.tolist())
    rare = np.array([i for i in reg[::-1].tolist() if i not in taken][: 3 * n])
    members = np.concatenate([head[:, None], rare.reshape(n, 3)], axis=1)  # (n, 4)
    others = np.setdiff1d(reg, members.ravel())
    emb[others] *= 0.35
    centres = _directions(n, emb.shape[1], 3) * (t_max * 0.95)
    jitter = _directions(4 * n, emb.shape[1], 4).reshape(n, 4, -1) * spread
    emb[members] = centres[:, None, :] + jitter
    emb[top] = emb[top] / np.linalg.norm(emb[top]) * t_max
    return _crafted(bundle, emb)


def built_elsewhere(bundle: EdgeBundle) -> EdgeBundle:
    """The same tokenizer, table and policy under another id (a length limit one shorter): a
    genuine table as a machine whose arithmetic rounds a PCA direction otherwise would build
    it, so the edge does not know it and measures it (the control of the crafted ones)."""
    meta = {k: v for k, v in bundle.meta.items() if k not in ("files", "bundle_id")}
    meta["max_length"] = int(meta["max_length"]) - 1
    return EdgeBundle(bundle._tokenizer_json, bundle._embeddings, meta, bundle.encoder_onnx,
                      table=bundle._table)


CRAFTED = {"frequent-isolated": frequent_isolated, "char-tokenizer": char_tokenizer,
           "groups-of-four": groups_of_four}
