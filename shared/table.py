"""The privatization table: the space in which ``dchi-text`` adds noise and searches.

Text-to-text dχ-privacy (Qu et al. 2021 §3.2.4, after Feyisetan et al. 2020) perturbs φ(x)
and returns the regular token whose row is nearest. Nothing requires φ to be the model's
own input embedding: the guarantee is η·d(x, x')-privacy for the Euclidean distance d *in the
table that was used*, and the model reads token ids either way. So the table is a designed
part of the bundle:

* ``projection``: ``none`` (the model's word embeddings as they are) or ``pca`` (the top k
  principal directions of the regular rows, fitted on the table itself -- never on text, so
  no private data can shape it). An orthogonal projection after centring: distances only
  shrink, and the noise lives in k dimensions instead of n.
* ``dtype``: ``float32``, or ``int8`` with one float32 scale per column. An int8 table *is*
  its dequantized values ``float32(q) * scale`` (one rounding, the same in every language):
  noise and search run over those, so the search is exact by construction.

Pure numpy, no I/O: :mod:`shared.bundle` stores what :func:`build_table` returns.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

PROJECTIONS = ("none", "pca")
DTYPES = ("float32", "int8")
INT8_MAX = 127
# What new dchi-text models on the default MiniLM get, and the η of each table (under a token
# policy) at matched privacy: the strongest attack we have (the context-free Bayes posterior or
# the contextual denoiser, whichever recovers more) recovers no more content tokens, rare
# tokens, and content tokens up to a near neighbour than from the 384-d table at η 65, every
# token privatized (bench/results/frontier.md; measured points, at or below the interpolated η).
DEFAULT_TABLE = "pca32-int8"
# by candidate (:func:`candidate_key`: a table, and a token policy with its p)
MATCHED_ETA = {"none": 65.0, "pca32-int8": 40.0, "pca32-int8+function-words@0.3": 40.0}


def candidate_key(table: str, policy: str = "none", p: float | None = None) -> str:
    """The frontier's name of a table under a token policy: ``pca32-int8``, or
    ``pca32-int8+function-words@0.3`` (bench.utility.frontier's Candidate.key)."""
    return table if policy == "none" else f"{table}+{policy}@{p:g}"


def matched_eta(table: str, policy: str = "none", p: float | None = None) -> float | None:
    """The η at which ``table`` under ``policy`` (public words sent as typed with probability
    1 - p) matches the 384-d table at η 65 (bench/results/frontier.md), or None: not measured."""
    return MATCHED_ETA.get(candidate_key(table, policy, p))


def table_for_new_model(mechanism: str, table: str | None, bundle_given: bool) -> str | None:
    """The privatization table a new model is trained over: ``table`` when one is asked for;
    :data:`DEFAULT_TABLE` for ``dchi-text`` on the packaged MiniLM (no bundle or base model
    given); else None (the model's own embeddings: ``dchi-embedding`` sends vectors in them)."""
    if table is None and not bundle_given and mechanism == "dchi-text":
        return DEFAULT_TABLE
    return table


class TableError(ValueError):
    """A table that cannot be built or does not match its description (one line)."""


@dataclass(frozen=True)
class TableSpec:
    """What to build: a projection (``none`` or ``pca`` with ``k``) and a storage dtype."""

    projection: str = "none"
    k: int | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.projection not in PROJECTIONS:
            raise TableError(f"projection must be one of {', '.join(PROJECTIONS)}, "
                             f"got {self.projection!r}")
        if self.dtype not in DTYPES:
            raise TableError(f"table dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.projection == "pca":
            if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
                raise TableError(f"pca needs a whole number of dimensions k >= 1, got {self.k!r}")
        elif self.k is not None:
            raise TableError("k is only for the pca projection")

    @classmethod
    def parse(cls, text: str) -> TableSpec:
        """``384``-style names are not accepted; the forms are ``none``, ``none-int8``,
        ``pca32``, ``pca32-int8`` (what ``--table`` takes)."""
        name = text.strip().lower()
        dtype = "float32"
        if name.endswith("-int8"):
            name, dtype = name[: -len("-int8")], "int8"
        elif name.endswith("-float32"):
            name = name[: -len("-float32")]
        if name == "none":
            return cls("none", None, dtype)
        if name.startswith("pca") and name[3:].isdigit():
            return cls("pca", int(name[3:]), dtype)
        raise TableError(f"unknown table {text!r}: use none, none-int8, pcaK or pcaK-int8 "
                         "(e.g. pca32-int8)")

    @property
    def name(self) -> str:
        base = "none" if self.projection == "none" else f"pca{self.k}"
        return base if self.dtype == "float32" else f"{base}-int8"


@dataclass(frozen=True)
class Table:
    """A built table: the stored arrays and the float32 values noise and search run over."""

    values: np.ndarray                 # (V, k) float32: what the mechanism uses
    stored: np.ndarray                 # (V, k) float32 or int8: what the bundle stores
    scale: np.ndarray | None           # (k,) float32 for int8, else None
    description: dict[str, Any] = field(default_factory=dict)  # bundle.json's "table" block

    @property
    def dim(self) -> int:
        return int(self.values.shape[1])


def dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """float32(q) * scale, one float32 rounding per value (exact in float64 first: an int8
    times a float32 has at most 31 significant bits), as every edge computes it."""
    q = np.asarray(q)
    if q.dtype != np.int8:
        raise TableError(f"an int8 table must be int8, got {q.dtype}")
    s = np.asarray(scale, dtype=np.float32)
    if s.ndim != 1 or s.shape[0] != q.shape[1]:
        raise TableError(f"the table's scale has shape {s.shape}, expected ({q.shape[1]},)")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise TableError("the table's scale must be finite and > 0 in every column")
    return (q.astype(np.float64) * s.astype(np.float64)).astype(np.float32)


def quantize_int8(values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-column int8: scale_j = max |v_ij| over ``rows`` / 127, q = round(v / s)
    clipped to [-127, 127] (rows outside ``rows``, the special tokens, are clipped too)."""
    v = np.asarray(values, dtype=np.float64)
    top = np.abs(v[np.asarray(rows)]).max(axis=0)
    top = np.where(top > 0, top, 1.0)
    scale = (top / INT8_MAX).astype(np.float32)
    q = np.clip(np.rint(v / scale.astype(np.float64)), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale


def pca_basis(embeddings: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and the top ``k`` principal directions (n, k) of the table's ``rows``, each
    direction signed so that its largest-magnitude entry is positive (a fixed sign: the same
    table gives the same basis on every machine up to rounding)."""
    x = np.asarray(embeddings, dtype=np.float64)[np.asarray(rows)]
    n = x.shape[1]
    if not 1 <= k <= n:
        raise TableError(f"pca k={k} must be between 1 and the table's dimension {n}")
    mean = x.mean(axis=0)
    c = x - mean
    cov = (c.T @ c) / max(x.shape[0] - 1, 1)
    w, v = np.linalg.eigh(cov)
    order = np.argsort(w)[::-1][:k]
    basis = v[:, order]
    flip = np.sign(basis[np.abs(basis).argmax(axis=0), np.arange(k)])
    return mean, basis * flip


def table_digest(values: np.ndarray) -> str:
    """SHA-256 of a float32 table's little-endian bytes (the source named in provenance)."""
    a = np.ascontiguousarray(values, dtype="<f4")
    return hashlib.sha256(a.data.cast("B")).hexdigest()


def build_table(embeddings: np.ndarray, regular_ids: np.ndarray, spec: TableSpec,
                source: dict[str, Any] | None = None) -> Table:
    """The privatization table of ``spec`` over the model's word ``embeddings`` (V, n).

    The projection is fitted on the regular rows of ``embeddings`` only: the table itself,
    no text. ``source`` (e.g. the model's name) is recorded in the provenance with the
    source table's digest, which a trainer checks against its model's embeddings.
    """
    emb = np.asarray(embeddings, dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] == 0:
        raise TableError(f"embeddings must be a non-empty 2-D table, got shape {emb.shape}")
    rows = np.asarray(regular_ids, dtype=np.int64)
    if spec.projection == "pca":
        k = int(cast(int, spec.k))  # TableSpec: pca has a whole k >= 1
        mean, basis = pca_basis(emb, rows, k)
        projected = ((emb.astype(np.float64) - mean) @ basis).astype(np.float32)
        projection = {"kind": "pca", "k": k, "fitted_on": "table",
                      "centred": True,
                      "explained_variance": _explained(emb, rows, basis, mean)}
    else:
        projected = emb
        projection = {"kind": "none"}
    if spec.dtype == "int8":
        q, scale = quantize_int8(projected, rows)
        values, stored = dequantize(q, scale), q
        quant = {"kind": "int8-symmetric-per-column", "dequantized": "float32(q) * scale"}
    else:
        values, stored, scale, quant = projected, projected, None, None
    dup = duplicate_rows(values, rows)
    if dup is not None:
        raise TableError(f"table {spec.name}: regular tokens {dup[0]} and {dup[1]} have the "
                         "same row; choose more dimensions or float32")
    desc = {"name": spec.name, "dim": int(values.shape[1]), "dtype": spec.dtype,
            "projection": projection, "quantization": quant,
            "source": {**(source or {}), "dim": int(emb.shape[1]),
                       "sha256": table_digest(emb)}}
    return Table(values=values, stored=stored, scale=scale, description=desc)


def _explained(emb: np.ndarray, rows: np.ndarray, basis: np.ndarray, mean: np.ndarray) -> float:
    x = emb[rows].astype(np.float64) - mean
    total = float(np.einsum("ij,ij->", x, x))
    kept = float(np.einsum("ij,ij->", x @ basis, x @ basis))
    return round(kept / total, 6) if total > 0 else 0.0


def duplicate_rows(values: np.ndarray, rows: np.ndarray) -> tuple[int, int] | None:
    """The first two ``rows`` (token ids) whose rows are bit-identical, else None."""
    seen: dict[bytes, int] = {}
    t = np.ascontiguousarray(values)
    for i in np.asarray(rows, dtype=np.int64):
        key = t[int(i)].tobytes()
        j = seen.setdefault(key, int(i))
        if j != int(i):
            return j, int(i)
    return None
