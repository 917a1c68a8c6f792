"""Training data for the server: privatized records in, padded tensors out.

Readers take the edge agent's JSONL of :class:`shared.payload.Record` lines, or
(payload, label) pairs as the record store of the service holds them. A
:class:`PayloadDataset` keeps only the payload arrays (numpy, compact), the
targets and a fingerprint; there is no raw text anywhere in it.

Model input from payloads (token payloads carry no [CLS]/[SEP]: the server adds them,
ARCHITECTURE.md "Payloads"):

* ``dchi-text`` / ``none``: ``[CLS] ids [SEP]`` (pairs ``[CLS] a [SEP] b [SEP]``, token
  type 0 up to and including the first [SEP], 1 after);
* ``dchi-embedding``: the same layout, the payload rows in place of the ids and the
  [CLS]/[SEP] rows taken from the frozen table by the model;
* ``laplace`` / ``texthide``: the vector; ``ome``: the bits as 0/1 floats.

This module imports no torch at import time: the onnx serving backend collates with it
(``collate_payloads(..., as_numpy=True)``) in an image that has no torch; only
:func:`collate`'s tensors need it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

import numpy as np

from edge_agent.privatize.privatizer import trim_pair
from shared.arrays import Limits
from shared.mechanisms import registry
from shared.payload import Record, parse_record

if TYPE_CHECKING:
    import torch

def kind_of(mechanism: str) -> str:
    """"tokens", "embeddings" or "vector": which classifier reads this payload mechanism
    (its registered ``payload_kind``)."""
    try:
        return registry.get(mechanism).payload_kind.classifier
    except registry.UnknownMechanism:
        raise ValueError(f"unknown mechanism {mechanism!r}; expected one of "
                         f"{', '.join(registry.names())}") from None


# -- labelled text (TSV) ---------------------------------------------------------------------
@dataclass
class LabelledText:
    """Sentences (or pairs) and their string labels, as read from a TSV."""

    texts: list[str]
    labels: list[str]
    pairs: list[str] | None = None
    skipped_empty: int = 0

    def __len__(self) -> int:
        return len(self.texts)


def read_labelled_tsv(path: str | os.PathLike, limit: int | None = None) -> LabelledText:
    """A TSV with header ``sentence<TAB>label`` or ``sentence_a<TAB>sentence_b<TAB>label``.

    Columns are found by name (extra columns are ignored). Rows with an empty sentence
    are skipped and counted. Raises ValueError naming the file for missing columns,
    short rows or an empty label; FileNotFoundError if the file is missing.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    csv.field_size_limit(sys.maxsize)
    out = LabelledText([], [])
    try:
        with open(p, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = [h.strip() for h in next(reader, [])]
            if "label" not in header or not (
                "sentence" in header or {"sentence_a", "sentence_b"} <= set(header)
            ):
                raise ValueError(f"{p}: header must be 'sentence<TAB>label' or "
                                 f"'sentence_a<TAB>sentence_b<TAB>label', got {header!r}")
            pair = "sentence" not in header
            ia = header.index("sentence_a" if pair else "sentence")
            ib = header.index("sentence_b") if pair else None
            il = header.index("label")
            need = max(ia, il, ib or 0) + 1
            out.pairs = [] if pair else None
            for lineno, row in enumerate(reader, start=2):
                if not row:
                    continue
                if len(row) < need:
                    raise ValueError(f"{p}:{lineno}: {len(row)} column(s), the header names "
                                     f"{need}")
                a, label = row[ia].strip(), row[il].strip()
                b = row[ib].strip() if ib is not None else None
                if not label:
                    raise ValueError(f"{p}:{lineno}: empty label")
                if not a or (pair and not b):
                    out.skipped_empty += 1
                    continue
                out.texts.append(a)
                out.labels.append(label)
                if out.pairs is not None and b is not None:  # pairs: b is there (checked)
                    out.pairs.append(b)
                if limit is not None and len(out.texts) >= limit:
                    break
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return out


# -- labels ----------------------------------------------------------------------------------
def label_names_from(labels: Iterable[str]) -> list[str]:
    """The sorted distinct class names (numeric names sorted as numbers: "2" < "10")."""
    names = set(labels)

    def key(s: str):
        try:
            return (0, float(s), s)
        except ValueError:
            return (1, 0.0, s)

    return sorted(names, key=key)


def label_indices(labels: Sequence[str], names: Sequence[str]) -> list[int]:
    """Class indices of ``labels`` in ``names``; ValueError names the first unknown label."""
    index = {n: i for i, n in enumerate(names)}
    unknown = sorted({x for x in labels if x not in index})
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:5])
        raise ValueError(f"unknown label(s) {shown}; the model knows {', '.join(names)}")
    return [index[x] for x in labels]


def _target(label, names: Sequence[str] | None, where: str) -> int | list[float]:
    if label is None:
        raise ValueError(f"{where}: record has no label (training needs labelled records)")
    if isinstance(label, str):
        if names is None or label not in names:
            raise ValueError(f"{where}: unknown label {label!r}"
                             + (f"; labels are {', '.join(names)}" if names else ""))
        return list(names).index(label)
    if isinstance(label, int):
        if label < 0 or (names is not None and label >= len(names)):
            raise ValueError(f"{where}: label index {label} out of range"
                             + (f" (0..{len(names) - 1})" if names else ""))
        return label
    if names is not None and len(label) != len(names):
        raise ValueError(f"{where}: soft label of length {len(label)} for {len(names)} classes")
    if min(label) < 0 or abs(sum(label) - 1.0) > 1e-3:
        raise ValueError(f"{where}: a soft label must be non-negative and sum to 1")
    return [float(v) for v in label]


# -- records -> dataset ----------------------------------------------------------------------
def _canonical(record: Record) -> bytes:
    obj = record.model_dump(mode="json")
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class PayloadDataset:
    """Payload arrays of one mechanism/bundle with their targets; no raw text.

    ``targets`` is int64 (N,) for hard labels or float32 (N, C) for soft ones.
    ``fingerprint`` = sha256 over the sorted sha256 of each record's canonical JSON
    (payload and label), so the same records in any order give the same fingerprint.
    """

    mechanism: str
    params: dict
    bundle_id: str
    arrays: list[np.ndarray]
    segments: list[tuple[int, ...] | None]
    targets: np.ndarray
    label_names: list[str]
    fingerprint: str
    n_soft: int = 0
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrays)

    @property
    def kind(self) -> str:
        return kind_of(self.mechanism)

    @property
    def soft(self) -> bool:
        return self.targets.ndim == 2

    def lengths(self) -> np.ndarray:
        """Tokens per example (vectors: all 1), for length-sorted buckets."""
        if self.kind == "vector":
            return np.ones(len(self), dtype=np.int64)
        return np.array([a.shape[0] for a in self.arrays], dtype=np.int64)

    def feature_dim(self) -> int:
        """r for vectors, r*l for OME bits, n for embeddings, 0 for ids."""
        a = self.arrays[0]
        return 0 if self.kind == "tokens" else int(a.shape[-1])

    def subset(self, idx: Sequence[int]) -> PayloadDataset:
        return PayloadDataset(self.mechanism, self.params, self.bundle_id,
                              [self.arrays[i] for i in idx], [self.segments[i] for i in idx],
                              self.targets[np.asarray(idx, dtype=np.int64)], self.label_names,
                              self.fingerprint, self.n_soft, dict(self.extra))


def _infer_label_names(labels: list, where: str) -> list[str]:
    """String labels: their sorted names; indices / soft vectors: "0".."C-1" (at least 2)."""
    strings = [x for x in labels if isinstance(x, str)]
    if strings and len(strings) != len(labels):
        raise ValueError(f"{where}: mixes class names and indices as labels")
    if strings:
        return label_names_from(strings)
    hard = [x for x in labels if isinstance(x, int)]
    soft = [x for x in labels if isinstance(x, list)]
    n = max([max(hard) + 1 if hard else 0] + [len(s) for s in soft] + [2])
    return [str(i) for i in range(n)]


def dataset_from_records(records: Iterable[Record | tuple], label_names: Sequence[str] | None,
                         *, where: str = "records", allow_unlabelled: bool = False
                         ) -> PayloadDataset:
    """Build a dataset from :class:`Record` objects or (payload, label) pairs.

    All records must share mechanism, parameters and bundle_id (TextHide: m; k may differ
    between training records and k=1 prediction payloads). ``label_names`` None: int labels
    define the classes 0..max, string labels the sorted distinct names.
    """
    recs: list[Record] = []
    for r in records:
        recs.append(r if isinstance(r, Record) else Record(payload=r[0], label=r[1]))
    if not recs:
        raise ValueError(f"{where}: empty data set (no records)")
    first = recs[0].payload
    mech, bid = first.mechanism, first.bundle_id
    params = first.params.model_dump()
    if label_names is None:
        label_names = _infer_label_names([r.label for r in recs], where)
    names = list(label_names)
    arrays, segments, digests = [], [], []
    targets: list[int | list[float]] = []  # class indices, or soft labels
    # the parameters records must share (TextHide: the pool m, not k)
    compared = registry.get(mech).compared_params
    base = compared(params)
    for i, r in enumerate(recs):
        p = r.payload
        if p.mechanism != mech or p.bundle_id != bid:
            raise ValueError(f"{where}[{i}]: mixes {p.mechanism}/{p.bundle_id[:12]} with "
                             f"{mech}/{bid[:12]} (one model per mechanism and bundle)")
        if compared(p.params.model_dump()) != base:
            raise ValueError(f"{where}[{i}]: parameters {p.params.model_dump()} differ from "
                             f"{params} of the first record")
        if r.label is None and allow_unlabelled:
            targets.append(-1)
        else:
            targets.append(_target(r.label, names, f"{where}[{i}]"))
        arrays.append(p.data_array())
        seg = getattr(p, "segments", None)
        segments.append(tuple(seg) if seg else None)
        digests.append(hashlib.sha256(_canonical(r)).digest())
    n_soft = sum(isinstance(t, list) for t in targets)
    if n_soft:
        eye = np.eye(len(names), dtype=np.float32)
        tgt = np.stack([np.asarray(t, np.float32) if isinstance(t, list) else eye[t]
                        for t in targets])
    else:
        tgt = np.asarray(targets, dtype=np.int64)
    fp = hashlib.sha256(b"".join(sorted(digests))).hexdigest()
    if kind_of(mech) != "tokens":
        dims = {int(a.shape[-1]) for a in arrays}
        if len(dims) > 1:
            raise ValueError(f"{where}: payload arrays of different dimensions {sorted(dims)}")
    return PayloadDataset(mech, params, bid, arrays, segments, tgt, names, fp, n_soft)


def read_records_jsonl(path: str | os.PathLike, limits: Limits | None = None,
                       limit: int | None = None) -> list[Record]:
    """Records from the edge agent's JSONL (one :class:`Record` per line; blank lines skipped).

    ValueError names the file and line of the first invalid record.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    out: list[Record] = []
    with open(p, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(parse_record(line, limits))
            except ValueError as exc:  # pydantic ValidationError is a ValueError
                first = str(exc).strip().splitlines()
                msg = first[-1].strip() if first else "invalid record"
                raise ValueError(f"{p}:{lineno}: invalid record ({msg})") from None
            if limit is not None and len(out) >= limit:
                break
    return out


# -- collation -------------------------------------------------------------------------------
def fit_segments(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Trim a pair to ``budget`` tokens: the edge's policy "first" (the longer segment
    first, the second on a tie: ``edge_agent.privatize.privatizer.trim_pair``), so server
    and edge truncate alike."""
    return trim_pair(len_a, len_b, budget)


def _layout(n: int, seg: tuple[int, ...] | None, max_length: int) -> tuple[list[int], int, int]:
    """Rows of the payload kept, and the sizes of segment a and b after truncation."""
    if seg is None or len(seg) == 1:
        keep = min(n, max_length - 2)
        return list(range(keep)), keep, 0
    la, lb = fit_segments(seg[0], seg[1], max_length - 3)
    return list(range(la)) + list(range(seg[0], seg[0] + lb)), la, lb


def collate_arrays(arrays: Sequence[np.ndarray], segments: Sequence[tuple[int, ...] | None],
                   mechanism: str, special_ids: dict[str, int], max_length: int = 128
                   ) -> dict[str, np.ndarray]:
    """One padded batch (numpy) for the classifier of ``mechanism``.

    Token kinds: ``input_ids``, ``attention_mask``, ``token_type_ids`` (B, T) int64.
    Embeddings: the same plus ``token_rows`` (B, T, n) float32 and ``row_mask`` (B, T) bool
    (True where a payload row replaces the id's embedding).
    Vectors: ``features`` (B, d) float32.
    """
    return collate_kind(arrays, segments, kind_of(mechanism), special_ids, max_length)


def collate_kind(arrays: Sequence[np.ndarray], segments: Sequence[tuple[int, ...] | None],
                 kind: str, special_ids: dict[str, int], max_length: int = 128
                 ) -> dict[str, np.ndarray]:
    """:func:`collate_arrays` for a classifier kind ("tokens", "embeddings", "vector")."""
    if kind == "vector":
        return {"features": np.stack([np.asarray(a, dtype=np.float32) for a in arrays])}
    if max_length < 4:
        raise ValueError("max_length must be at least 4")
    cls, sep, pad = special_ids["cls"], special_ids["sep"], special_ids["pad"]
    layouts = [_layout(a.shape[0], s, max_length) for a, s in zip(arrays, segments, strict=True)]
    lens = [la + lb + (3 if s is not None and len(s) == 2 else 2)
            for (_, la, lb), s in zip(layouts, segments, strict=True)]
    b, t = len(arrays), max(lens)
    ids = np.full((b, t), pad, dtype=np.int64)
    att = np.zeros((b, t), dtype=np.int64)
    tt = np.zeros((b, t), dtype=np.int64)
    rows_pos = np.zeros((b, t), dtype=bool)
    emb = None
    if kind == "embeddings":
        emb = np.zeros((b, t, arrays[0].shape[1]), dtype=np.float32)
    for i, (a, s, (keep, la, lb)) in enumerate(zip(arrays, segments, layouts, strict=True)):
        pair = s is not None and len(s) == 2
        pos_a = np.arange(1, 1 + la)
        pos = np.concatenate([pos_a, np.arange(la + 2, la + 2 + lb)]) if pair else pos_a
        ids[i, 0] = cls
        ids[i, la + 1] = sep
        if pair:
            ids[i, la + lb + 2] = sep
            tt[i, la + 2: la + lb + 3] = 1
        att[i, : lens[i]] = 1
        if kind == "tokens":
            ids[i, pos] = a[keep]
        else:
            assert emb is not None  # kind "embeddings"
            emb[i, pos] = a[keep]
            rows_pos[i, pos] = True
    out: dict[str, np.ndarray] = {"input_ids": ids, "attention_mask": att, "token_type_ids": tt}
    if emb is not None:  # kind "embeddings"
        out["token_rows"] = emb
        out["row_mask"] = rows_pos
    return out


def collate(arrays: Sequence[np.ndarray], segments: Sequence[tuple[int, ...] | None],
            mechanism: str, special_ids: dict[str, int], max_length: int = 128
            ) -> dict[str, torch.Tensor]:
    """:func:`collate_arrays` as CPU tensors (sharing the arrays' memory)."""
    import torch

    return {k: torch.from_numpy(v) for k, v in collate_arrays(
        arrays, segments, mechanism, special_ids, max_length).items()}


@overload
def collate_payloads(payloads: Sequence, config: dict, as_numpy: Literal[False] = False
                     ) -> dict[str, torch.Tensor]: ...
@overload
def collate_payloads(payloads: Sequence, config: dict, as_numpy: Literal[True]
                     ) -> dict[str, np.ndarray]: ...
@overload
def collate_payloads(payloads: Sequence, config: dict, as_numpy: bool
                     ) -> dict[str, torch.Tensor] | dict[str, np.ndarray]: ...
def collate_payloads(payloads: Sequence, config: dict, as_numpy: bool = False
                     ) -> dict[str, torch.Tensor] | dict[str, np.ndarray]:
    """One padded batch for checked ``shared.payload`` payloads, laid out for the model whose
    ``config.json`` is ``config`` (its mechanism, special ids and max_length): the one
    collation of the torch model, the ONNX classifier and the serving backends.
    ``as_numpy=True``: numpy arrays (no torch needed), else CPU tensors."""
    arrays = [p.data_array() for p in payloads]
    segments = [tuple(s) if (s := getattr(p, "segments", None)) else None for p in payloads]
    args = (arrays, segments, config["mechanism"], config["special_ids"],
            int(config["max_length"]))
    return collate_arrays(*args) if as_numpy else collate(*args)


def example_payload_arrays(cfg: dict, rng: np.random.Generator, n: int = 5):
    """Random payload-shaped arrays for ``cfg``'s mechanism (lengths 1..12; one pair), and
    their segments: the ONNX export's check and the serving backends' warm-up."""
    arch = cfg["architecture"]
    kind_arrays, segments = [], []
    kind = registry.get(cfg["mechanism"]).payload_kind
    lo = max(cfg["special_ids"].values()) + 1
    for i in range(n):
        length = int(rng.integers(1, 13))
        if kind is registry.PayloadKind.TOKENS:
            a = rng.integers(lo, arch["bert_config"]["vocab_size"], size=length)
        elif kind is registry.PayloadKind.EMBEDDINGS:
            a = rng.normal(0, 1, (length, arch["bert_config"]["hidden_size"])).astype(np.float32)
        elif kind is registry.PayloadKind.BITS:
            a = rng.integers(0, 2, size=arch["in_dim"]).astype(np.float32)
        else:
            a = rng.normal(0, 1, size=arch["in_dim"]).astype(np.float32)
        kind_arrays.append(a)
        segments.append((length - length // 2, length // 2) if i == 1 and length > 1 else None)
    return kind_arrays, segments


def collate_dataset(ds: PayloadDataset, idx: Sequence[int] | np.ndarray, special_ids: dict[str, int],
                    max_length: int) -> dict[str, torch.Tensor]:
    """Collate examples ``idx`` of ``ds``."""
    return collate([ds.arrays[i] for i in idx], [ds.segments[i] for i in idx], ds.mechanism,
                   special_ids, max_length)


def collate_originals(ds: PayloadDataset, idx: Sequence[int] | np.ndarray, special_ids: dict[str, int],
                      max_length: int) -> torch.Tensor:
    """(B, T) int64: the original id at each payload position of the batch ``idx`` (laid out
    as :func:`collate_dataset` lays out the payloads), −100 at [CLS]/[SEP]/padding.
    ``ds.extra["originals"]`` holds one id array per example (public text only)."""
    orig = [ds.extra["originals"][i] for i in idx]
    segs = [ds.segments[i] for i in idx]
    for i, o in zip(idx, orig, strict=True):
        if len(o) != len(ds.arrays[i]):
            raise ValueError(f"example {i}: {len(o)} original ids for {len(ds.arrays[i])} "
                             "privatized ones")
    import torch

    ids = collate_kind(orig, segs, "tokens", special_ids, max_length)["input_ids"]
    rows = collate_kind([np.zeros((len(o), 1), np.float32) for o in orig], segs,
                        "embeddings", special_ids, max_length)["row_mask"]
    return torch.from_numpy(np.where(rows, ids, -100).astype(np.int64))


def length_buckets(lengths: np.ndarray, batch_size: int, rng: np.random.Generator | None,
                   pool: int = 50) -> Iterator[np.ndarray]:
    """Batches of indices with similar lengths (less padding).

    With ``rng``: shuffle, sort by length inside pools of ``pool`` batches, cut into batches,
    shuffle the batch order. Without: one pass sorted by length (evaluation).
    """
    n = len(lengths)
    if rng is None:
        order = np.argsort(lengths, kind="stable")
        for s in range(0, n, batch_size):
            yield order[s: s + batch_size]
        return
    perm = rng.permutation(n)
    chunk = batch_size * pool
    batches = []
    for s in range(0, n, chunk):
        part = perm[s: s + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches += [part[j: j + batch_size] for j in range(0, len(part), batch_size)]
    for k in rng.permutation(len(batches)):
        yield batches[k]
