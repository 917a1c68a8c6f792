"""Honest privacy accounting: the published guarantee next to the one that holds.

``guarantee(mechanism, bundle=None)`` returns::

    {"mechanism": name, "params": {...},
     "nominal":    {"epsilon": float | None, ...},   # as published
     "worst_case": {"epsilon": float | None, ...},   # what holds for any two inputs
     "notes": [plain-words sentences]}

See ARCHITECTURE.md "Honest accounting". The formulas are pure functions below.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import messages as msg
from shared.mechanisms.binary import OME, FixedPointBits
from shared.mechanisms.dchi import DChiEmbedding, DChiText
from shared.mechanisms.laplace import Laplace, dropout_epsilon
from shared.mechanisms.nearest import kth_neighbour_distances
from shared.mechanisms.plain import NoPrivacy
from shared.mechanisms.registry import GUARANTEE, as_mechanism
from shared.mechanisms.texthide import TextHide

if TYPE_CHECKING:
    from shared.bundle import EdgeBundle

NEIGHBOURS = (1, 10, 100)


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


# -- per mechanism (registered: ``mechanism.guarantee(...)`` finds them) ------------------------
@GUARANTEE.register(DChiEmbedding, DChiText)
def _dchi(mech: DChiEmbedding | DChiText, bundle: EdgeBundle | None, *, dim: int | None,
          sample: int) -> dict:
    if bundle is None and isinstance(mech, DChiText):
        bundle = mech.bundle
    eta = mech.eta
    g: dict[str, Any] = {
        "nominal": {"eta": eta, "epsilon": None,
                    "statement": msg.DCHI_STATEMENT},
        "worst_case": {"eta": eta, "epsilon": None},
        "notes": [
            f"Two tokens at embedding distance d are eta*d = {eta:g}*d indistinguishable; "
            "a sentence adds this over its tokens.",
            "dχ-privacy is not ε-LDP: distant tokens are much easier to tell apart than "
            "close ones.",
        ],
    }
    if isinstance(mech, DChiText):
        g["notes"].append("The nearest-token step is post-processing and keeps the guarantee.")
    policy = getattr(mech, "policy", None)
    if policy is not None:
        p = float(mech.public_p or 0.0)
        g["policy"] = {"name": policy.name, "public_words": policy.size, "p": p,
                       "sent_unchanged": 1.0 - p, "sha256": policy.digest}
        g["worst_case"]["epsilon_scope"] = msg.DCHI_POLICY_SCOPE
        g["notes"].append(
            f"Token policy {policy.name}: its {policy.size:,} public words (function words "
            f"and punctuation) are sent as typed with probability {1.0 - p:g} and privatized "
            f"otherwise (SanText+, Yue et al. 2021). They have no guarantee, among themselves "
            "or against any other word; every figure here is about the other words.")
    if bundle is None:
        g["notes"].append("Pass the bundle to see what eta means on its embedding table.")
        return g
    table = bundle.table[bundle.regular_ids]
    n = table.shape[1]
    rows = np.random.default_rng(0).choice(table.shape[0], min(sample, table.shape[0]),
                                           replace=False)
    ks = tuple(k for k in NEIGHBOURS if k < table.shape[0])
    dists = kth_neighbour_distances(table, rows, ks)
    med = {k: float(np.median(v)) for k, v in dists.items()}
    diameter_bound = bundle_diameter(bundle)
    noise = dchi_expected_noise_norm(n, eta)
    wc = g["worst_case"]
    wc["epsilon"] = eta * diameter_bound
    wc.setdefault("epsilon_scope", msg.DCHI_EPSILON_SCOPE)
    wc["epsilon_to_neighbour"] = {str(k): eta * med[k] for k in ks}
    wc["neighbour_distance_median"] = {str(k): med[k] for k in ks}
    wc["expected_noise_norm"] = noise
    wc["dim"] = n
    g["table"] = bundle.table_name
    names = "/".join(f"{k}{'st' if k == 1 else 'th'}" for k in ks)
    g["notes"] += [
        f"Privatization {bundle.describe_table()}: d is the distance in this table, and "
        "every figure here is measured on it.",
        f"On this table (n={n}) the median distance to the {names} nearest token is "
        + "/".join(f"{med[k]:.3f}" for k in ks) + ", so a token is "
        + "/".join(f"{eta * med[k]:.1f}" for k in ks) + "-indistinguishable from those "
        "neighbours.",
        f"The expected noise norm n/eta = {noise:.2f} is {noise / med[1]:.1f}x the median "
        "nearest-neighbour distance.",
        f"Between the two most distant tokens the bound is eta*d <= {wc['epsilon']:.1f} per "
        "token: read it as an LDP epsilon only with that number.",
    ]
    return g


@GUARANTEE.register(Laplace)
def _laplace(mech: Laplace, bundle: EdgeBundle | None, *, dim: int | None,
             sample: int) -> dict:
    """DPNR (Lyu et al. 2020): ε' of Theorem 2 is what is published with word dropout.

    Dropout amplifies only for inputs that differ in one dropped unit (the edge drops
    whole words, each with all its word pieces, independently with probability μ); two
    arbitrary sentences get the whole-vector figure.
    """
    if dim is None and bundle is not None:
        dim = sentence_vector_dim(bundle)
    eps, mu = mech.epsilon, mech.word_dropout
    nominal = dropout_epsilon(eps, mu) if mu else eps
    g: dict[str, Any] = {"nominal": {"epsilon": nominal,
                     "statement": f"epsilon = {eps:g} per sentence vector (Lyu et al. 2020, "
                                  "DPNR Theorem 1)"
                                  + (f", word dropout mu={mu:g} gives ln((1-mu)e^eps+mu) "
                                     "(Theorem 2)" if mu else "")},
         "worst_case": {"epsilon": None}, "notes": []}
    whole = None
    if mech.calibration == "vector":
        whole = eps
        g["notes"].append("Noise scale r/epsilon covers the L1 sensitivity r of a vector in "
                          "[0,1]^r: the whole vector is epsilon-DP.")
    elif dim is None:
        g["notes"].append("Coordinate calibration: the whole vector is r*epsilon-DP; pass the "
                          "bundle (or dim) to get the number.")
    else:
        whole = laplace_vector_epsilon(eps, "coordinate", dim)
        g["worst_case"]["dim"] = dim
        g["notes"].append(f"Coordinate calibration (scale 1/epsilon, as published) protects one "
                          f"coordinate; a vector of r={dim} values in [0,1] has L1 sensitivity "
                          f"r, so the whole vector is only {whole:g}-DP.")
    g["worst_case"]["epsilon"] = whole
    g["worst_case"]["epsilon_scope"] = "any two sentences"
    if mu:
        if whole is not None:
            g["worst_case"]["word_level_epsilon"] = dropout_epsilon(whole, mu)
        g["notes"].append(
            f"Word dropout (mu={mu:g}) lowers the figure to ln((1-mu)e^eps+mu)"
            + (f" = {dropout_epsilon(whole, mu):.4g}" if whole is not None else "")
            + " only between sentences that differ in one word (the edge drops each word, "
            "with all its word pieces, with probability mu); any two sentences get the figure "
            "above.")
    return g


@GUARANTEE.register(FixedPointBits)
def _bits(mech: FixedPointBits, bundle: EdgeBundle | None, *, dim: int | None,
          sample: int) -> dict:
    p, q = mech.bit_probabilities()
    worst = bit_flip_epsilon(p, q)
    g: dict[str, Any] = {"nominal": {"epsilon": mech.epsilon},
         "worst_case": {"epsilon": worst, "n_bits": mech.n_bits}, "notes": []}
    if isinstance(mech, OME):
        p_even, p_odd, q = mech.flip_probabilities()
        g["nominal"]["statement"] = "epsilon-LDP claimed (Lyu et al. 2020, OME Theorem 1)"
        g["worst_case"].update({"p_even": p_even, "p_odd": p_odd, "q": q})
        g["notes"].append(
            f"The published proof lets even and odd bit positions cancel. Any bit may change "
            f"between two inputs; summed over all {mech.n_bits} bits the worst case is "
            f"epsilon = {worst:.1f}, not {mech.epsilon:g}.")
    else:
        g["notes"].append(f"Randomized response with epsilon/{mech.n_bits} per bit; computed bit "
                          f"by bit, the whole vector is {worst:.3g}-LDP (at most the nominal "
                          "epsilon).")
    return g


@GUARANTEE.register(TextHide)
def _texthide(mech: TextHide, bundle: EdgeBundle | None, *, dim: int | None,
              sample: int) -> dict:
    return {"nominal": {"epsilon": None}, "worst_case": {"epsilon": None},
            "notes": [f"No differential-privacy guarantee. (m, k) = ({mech.m}, {mech.k}): k "
                      "inputs mixed, masks from a pool of m; security rests on a conjectured "
                      "computational hardness (Huang et al. 2020)."]}


@GUARANTEE.register(NoPrivacy)
def _none(mech: NoPrivacy, bundle: EdgeBundle | None, *, dim: int | None,
          sample: int) -> dict:
    return {"nominal": {"epsilon": math.inf}, "worst_case": {"epsilon": math.inf},
            "notes": ["No privatization: the server can read the text (Null-privacy "
                      "baseline only)."]}


def guarantee(mechanism, bundle: EdgeBundle | None = None, *, dim: int | None = None,
              sample: int = 2000) -> dict:
    """Published and worst-case guarantee of ``mechanism`` (a ``shared.mechanisms`` object,
    or the name "none"): ``mechanism.guarantee(...)``."""
    return as_mechanism(mechanism).guarantee(bundle, dim=dim, sample=sample)


def sentence_epsilon(g: dict, n_tokens: float) -> float | None:
    """Worst-case ε of a whole sentence of ``n_tokens`` tokens: dχ composes over the tokens
    (Qu et al. §3.2: the sum of the per-token bounds); the vector mechanisms' ε is already
    per sentence. None where there is no ε."""
    eps = g["worst_case"].get("epsilon")
    if eps is None:
        return None
    return eps * n_tokens if g["worst_case"].get("eta") is not None else eps


def summary(g: dict, mean_tokens: float | None = None) -> str:
    """One line for logs and CLI summaries; ``mean_tokens`` adds the worst case of a
    sentence of that many tokens (dχ)."""
    def fmt(part: dict) -> str:
        if part.get("eta") is not None:
            extra = f", worst eps {part['epsilon']:.1f}/token" if part.get("epsilon") else ""
            if part.get("epsilon") and mean_tokens:
                extra += (f" ({sentence_epsilon(g, mean_tokens):,.0f} for a sentence of "
                          f"{mean_tokens:.1f} tokens)")
            return f"eta={part['eta']:g}{extra}"
        eps = part.get("epsilon")
        return "none" if eps is None else f"eps={eps:.4g}"

    table = f" (table {g['table']})" if g.get("table") else ""
    pol = g.get("policy")
    policy = "" if not pol else " " + msg.DCHI_POLICY_CLAUSE.format(
        size=pol["public_words"], policy=pol["name"], keep=pol["sent_unchanged"])
    return (f"{g['mechanism']}: published {fmt(g['nominal'])}; "
            f"holds {fmt(g['worst_case'])}{table}{policy}")
