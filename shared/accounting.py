"""Honest privacy accounting: the published guarantee next to the one that holds.

``guarantee(mechanism, bundle=None)`` returns::

    {"mechanism": name, "params": {...},
     "nominal":    {"epsilon": float | None, ...},   # as published
     "worst_case": {"epsilon": float | None, ...},   # what holds for any two inputs
     "notes": [plain-words sentences]}

See ARCHITECTURE.md "Honest accounting". The formulas are pure functions below; each
mechanism's guarantee is in its own module (``shared/mechanisms/``), registered in the
registry's ``GUARANTEE`` table, and reads them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import messages as msg
from shared.mechanisms.registry import Mechanism, as_mechanism

if TYPE_CHECKING:
    from shared.bundle import EdgeBundle

# -- pure formulas --------------------------------------------------------------------------
def bit_flip_epsilon(p: np.ndarray, q: float) -> float:
    """Worst-case ε of independent randomized response on bits with Pr[1->1] = p_i, Pr[0->1] = q.

    Every bit may differ between two inputs, so the bound is the sum over bits of
    ln max(p_i/q, q/p_i, (1-p_i)/(1-q), (1-q)/(1-p_i)).
    """
    p = np.asarray(p, dtype=np.float64)
    if np.any((p <= 0) | (p >= 1)) or not (0 < q < 1):
        return math.inf
    lp, lq, l1p, l1q = np.log(p), math.log(q), np.log1p(-p), math.log1p(-q)
    per_bit = np.maximum(np.abs(lp - lq), np.abs(l1p - l1q))
    return float(per_bit.sum())


def laplace_vector_epsilon(epsilon: float, calibration: str, dim: int) -> float:
    """ε for the whole [0,1]^r vector: ε ("vector", scale r/ε) or r·ε ("coordinate", scale 1/ε)."""
    return epsilon if calibration == "vector" else dim * epsilon


def sentence_vector_dim(bundle: EdgeBundle) -> int:
    """r, the size of the bundle's sentence vectors: its encoder's ``output_dim``, else n."""
    return int((bundle.meta.get("encoder") or {}).get("output_dim", bundle.dim))


def dchi_diameter_bound(embeddings: np.ndarray, rows: np.ndarray | None = None) -> float:
    """D = 2 max ||phi(x)|| over ``rows`` of the table (default: all): no two of those
    tokens are further apart, so eta*D bounds the dχ ε between any two of them per token
    (Qu et al. §3.2).

    Exact, so that every edge charges the same D to the last bit: each ||phi||² is the
    correctly rounded sum of its float64 squares (exact for a float32 table), taken by
    :func:`math.fsum` on the rows whose float64 sum lies within the summation error of the
    largest; then D = 2 sqrt of the largest (the web edge's ``EdgeBundle.diameter`` does
    the same)."""
    emb = np.asarray(embeddings)
    if emb.dtype != np.float32:
        emb = emb.astype(np.float64)
    if rows is not None:
        emb = emb[np.asarray(rows)]
    if not emb.size:
        return 0.0
    approx = np.einsum("ij,ij->i", emb, emb)  # in the table's precision: a filter only
    top = float(approx.max())
    if not math.isfinite(top) and emb.dtype == np.float32:  # float32 overflow: in float64
        emb = emb.astype(np.float64)
        approx = np.einsum("ij,ij->i", emb, emb)
        top = float(approx.max())
    if not math.isfinite(top):
        return 2.0 * math.sqrt(top) if top > 0 else math.nan
    # a sum of n non-negative rounded squares in any order is within about (n + 1) u of the
    # exact sum (u: the unit roundoff of the sums' dtype): 4 (n + 1) u is a safe margin
    u = float(np.finfo(approx.dtype).eps) / 2
    rows64 = emb[approx >= top * (1.0 - 4.0 * (emb.shape[1] + 1) * u)].astype(np.float64)
    if approx.dtype != np.float64:  # the same filter again in float64, on those rows
        sums = np.einsum("ij,ij->i", rows64, rows64)
        rows64 = rows64[sums >= sums.max() * (1.0 - 4.0 * (emb.shape[1] + 1) * 2.0 ** -53)]
    best = max(math.fsum((r * r).tolist()) for r in rows64)
    return 2.0 * math.sqrt(best)


_DIAMETERS: dict[str, float] = {}


def bundle_diameter(bundle: EdgeBundle) -> float:
    """D of a bundle's regular table (:func:`dchi_diameter_bound`), computed once per bundle
    id: the ledger's costs and the printed guarantee read this one figure."""
    if bundle.bundle_id not in _DIAMETERS:
        _DIAMETERS[bundle.bundle_id] = dchi_diameter_bound(bundle.table, bundle.regular_ids)
    return _DIAMETERS[bundle.bundle_id]


def dchi_expected_noise_norm(dim: int, eta: float) -> float:
    """E||N|| = n/η (mean of Gamma(n, 1/η), Qu et al. §5.2)."""
    return dim / eta


# -- the guarantee of a mechanism (its own module registers it) ------------------------------


def guarantee(mechanism: Mechanism | str, bundle: EdgeBundle | None = None, *,
              dim: int | None = None, sample: int = 2000) -> dict[str, Any]:
    """Published and worst-case guarantee of ``mechanism`` (a ``shared.mechanisms`` object,
    or the name "none"): ``mechanism.guarantee(...)``."""
    return as_mechanism(mechanism).guarantee(bundle, dim=dim, sample=sample)


def sentence_epsilon(g: dict[str, Any], n_tokens: float) -> float | None:
    """Worst-case ε of a whole sentence of ``n_tokens`` tokens: dχ composes over the tokens
    (Qu et al. §3.2: the sum of the per-token bounds); the vector mechanisms' ε is already
    per sentence. None where there is no ε."""
    eps: float | None = g["worst_case"].get("epsilon")
    if eps is None:
        return None
    return eps * n_tokens if g["worst_case"].get("eta") is not None else eps


def summary(g: dict[str, Any], mean_tokens: float | None = None) -> str:
    """One line for logs and CLI summaries; ``mean_tokens`` adds the worst case of a
    sentence of that many privatized tokens (dχ; under a token policy, those outside its
    public list)."""
    def fmt(part: dict[str, Any]) -> str:
        if part.get("eta") is not None:
            extra = f", worst eps {part['epsilon']:.1f}/token" if part.get("epsilon") else ""
            if part.get("epsilon") and mean_tokens:
                extra += (f" ({sentence_epsilon(g, mean_tokens):,.0f} for a sentence of "
                          f"{mean_tokens:.1f} tokens"
                          + (" outside the public list)" if g.get("policy") else ")"))
            return f"eta={part['eta']:g}{extra}"
        eps = part.get("epsilon")
        return "none" if eps is None else f"eps={eps:.4g}"

    table = f" (table {g['table']})" if g.get("table") else ""
    pol = g.get("policy")
    policy = "" if not pol else " " + msg.DCHI_POLICY_CLAUSE.format(
        size=pol["public_words"], policy=pol["name"], keep=pol["sent_unchanged"])
    return (f"{g['mechanism']}: published {fmt(g['nominal'])}; "
            f"holds {fmt(g['worst_case'])}{table}{policy}")
