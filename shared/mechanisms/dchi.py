"""dχ-privacy for token embeddings (Qu et al. 2021 §3.2, after Feyisetan et al. 2020).

Noise N = r·u with r ~ Gamma(n, 1/η) (shape n, scale 1/η) and u uniform on the
unit sphere of R^n (Qu et al. §3.2.3, Eq. 3). Its density is proportional to
exp(-η ||N||), which is what gives η·d(x, x')-privacy for the Euclidean
distance d. Per-coordinate noise (Gaussian or Laplace in each coordinate) is a
different distribution and does not give this guarantee.

Text-to-text privatization (§3.2.4) returns the regular vocabulary token nearest
to the noisy embedding, which is post-processing and keeps the guarantee.

A token policy (``public_p`` set, :mod:`shared.policy`: SanText+'s rule, Yue et al. 2021
§3.3) sends each public word of the bundle's list as it is with probability 1 − p and
privatizes it otherwise; every other token is privatized exactly as without a policy. The
randomness is drawn in a fixed order, which both edges follow: first one uniform double per
public token (:func:`shared.policy.kept_public`), then the noise of the tokens privatized, in
order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from shared import messages as msg
from shared.accounting import bundle_diameter, dchi_expected_noise_norm
from shared.arrays import STRICT, PosFloat
from shared.floor import ESTIMATE_TOKENS, dchi_floor, measure_unchanged, table_problem
from shared.ledger import Cost, check_amount, check_count, finite_cost
from shared.mechanisms.checks import finite_array, positive, positive_int
from shared.mechanisms.computable import check_dchi_eta
from shared.mechanisms.nearest import ExactNearest, NearestIndex, kth_neighbour_distances
from shared.mechanisms.registry import (
    COMPUTABLE,
    COST,
    FLOOR,
    GUARANTEE,
    BaseMechanism,
    PayloadKind,
    need,
)
from shared.policy import TokenPolicy, kept_public
from shared.rng import resolve_rng

if TYPE_CHECKING:
    import numpy.typing as npt

    from shared.bundle import EdgeBundle

NEIGHBOURS = (1, 10, 100)  # the k-th nearest neighbours the guarantee reads eta at


def sample_dchi_noise(
    count: int, dim: int, eta: float, rng: np.random.Generator | None = None
) -> npt.NDArray[np.float64]:
    """``count`` noise vectors in R^dim: radius ~ Gamma(dim, 1/eta), direction uniform.

    Returns float64 of shape (count, dim).
    """
    count = positive_int("count", count, minimum=0)
    dim = positive_int("dim", dim)
    eta = positive("eta", eta)
    if not math.isfinite(1.0 / eta):
        raise ValueError(msg.DCHI_INVERSE_OVERFLOW.format(eta=eta))
    rng = resolve_rng(rng)
    radius = rng.gamma(shape=dim, scale=1.0 / eta, size=count)
    direction = rng.standard_normal((count, dim))
    norms = np.linalg.norm(direction, axis=1)
    while count and (zero := norms == 0).any():  # probability zero; never silently divide by 0
        direction[zero] = rng.standard_normal((int(zero.sum()), dim))
        norms = np.linalg.norm(direction, axis=1)
    direction /= norms[:, None]
    return direction * radius[:, None]


class DChiParams(BaseModel):
    """dχ-privacy: η > 0; with a token policy, ``public_p`` in [0, 1]: the probability that a
    public word is privatized anyway (absent: no policy, every token privatized)."""

    model_config = STRICT
    eta: PosFloat
    public_p: Annotated[float, Field(strict=True, ge=0, le=1)] | None = None

    # no return annotation: pydantic would take it for the serialization schema (the OpenAPI
    # document's), which must stay this model's own
    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        # no policy: the params of every earlier payload
        return {k: v for k, v in handler(self).items() if v is not None}


DCHI_HELP = {"eta": "dχ-privacy eta > 0",
             "public_p": "token policy: the probability P in [0, 1] that a public word of the "
                         "bundle's list is privatized anyway (sent as typed otherwise); "
                         "without it, every token is privatized"}


def policy_of(name: str, bundle: EdgeBundle | None, public_p: float | None
              ) -> TokenPolicy | None:
    """The bundle's token policy when ``public_p`` asks for one; ValueError when the bundle
    has none (a policy is part of the bundle: ``cloud-api export-bundle --policy``)."""
    if public_p is None:
        return None
    p = float(public_p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(msg.POLICY_P_RANGE.format(public_p=repr(public_p)))
    if bundle is None or bundle.policy is None:
        why = msg.POLICY_NONE_IN_BUNDLE.format(bundle_id12=bundle.bundle_id[:12]) \
            if bundle is not None else msg.POLICY_NO_BUNDLE
        raise ValueError(msg.POLICY_NEEDED.format(mechanism=name, why=why))
    return bundle.policy


def _noise_rows(x: np.ndarray, eta: float, rng: np.random.Generator) -> np.ndarray:
    return x.astype(np.float64) + sample_dchi_noise(x.shape[0], x.shape[1], eta, rng)


class _PolicyMixin:
    """The token policy of a dχ mechanism (``public_p`` and the bundle's public list)."""

    eta: float
    public_p: float | None
    policy: TokenPolicy | None

    @property
    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"eta": self.eta}
        if self.public_p is not None:
            out["public_p"] = self.public_p
        return out

    def kept(self, ids: np.ndarray, public: np.ndarray | None,
             rng: np.random.Generator) -> np.ndarray | None:
        """Which of ``ids`` are sent as they are (None without a policy); ``public``: the
        policy's mask of the batch (:func:`shared.policy.public_masks`: word by word, per
        text), else the batch read as one text."""
        if self.policy is None:
            return None
        if public is None:
            public = self.policy.public_mask(ids)
        public = np.asarray(public, dtype=bool)
        if public.shape != ids.shape:
            raise ValueError(f"the public mask has shape {public.shape}, the ids {ids.shape}")
        return kept_public(public, float(self.public_p or 0.0), rng)


class DChiEmbedding(_PolicyMixin, BaseMechanism):
    """Token representation privatization M_rep(x) = x + N (Qu et al. §3.2.3)."""

    name = "dchi-embedding"
    Params = DChiParams
    payload_kind = PayloadKind.EMBEDDINGS
    family = "dchi"
    edge_options = frozenset({"float16"})
    param_help = DCHI_HELP
    param_metavar = {"public_p": "P"}

    def __init__(self, eta: float, *, public_p: float | None = None,
                 bundle: EdgeBundle | None = None):
        self.eta = positive("eta", eta)
        self.policy = policy_of(self.name, bundle, public_p)
        self.public_p = None if public_p is None else float(public_p)
        self._policy_bundle = bundle.bundle_id if self.policy is not None and bundle else None

    @classmethod
    def from_params(cls, params: Mapping[str, Any], bundle: EdgeBundle | None = None, *,
                    dim: int | None = None, secret: int | None = None) -> DChiEmbedding:
        return cls(need(cls.name, params, "eta"), public_p=params.get("public_p"),
                   bundle=bundle)

    def privatize_tokens(self, ids: np.ndarray, bundle: EdgeBundle,
                         rng: np.random.Generator | None, *,
                         public: np.ndarray | None = None) -> np.ndarray:
        """The noisy embeddings of the ids' rows of the bundle's table (the model's own word
        embeddings: ``bundle.embeddings`` refuses a bundle that carries a designed table);
        under a token policy a public word sent as it is is its row, unchanged."""
        if self.policy is None:
            return self.privatize(bundle.embeddings[ids], rng)
        if bundle.bundle_id != self._policy_bundle:
            raise ValueError("the DChiEmbedding policy was built for another bundle")
        a = np.asarray(ids, dtype=np.int64)
        rng = resolve_rng(rng)
        keep = self.kept(a, public, rng)
        rows = bundle.embeddings[a]
        out = rows.astype(np.float32).copy()
        priv = ~keep if keep is not None else np.ones(a.shape, dtype=bool)
        if priv.any():
            out[priv] = self.privatize(rows[priv], rng)
        return out

    def privatize(self, embeddings: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Perturb each row of ``embeddings`` (L, n); returns float32 (L, n).

        ValueError if the noise does not fit in float32 (``shared.floor.check_computable``
        refuses such an η before any work)."""
        x = finite_array("embeddings", embeddings, ndim=2)
        noise = sample_dchi_noise(x.shape[0], x.shape[1], self.eta, rng)
        try:
            with np.errstate(over="raise", invalid="raise"):
                return (x.astype(np.float64) + noise).astype(np.float32)
        except FloatingPointError:
            raise ValueError(msg.DCHI_NOISE_OVERFLOW.format(eta=self.eta)) from None

    def floor_text(self, bundle: EdgeBundle) -> DChiText:
        """What the privacy floor measures (``shared.floor.measure_unchanged``): the
        nearest regular token of a noisy row, as ``dchi-text`` at this η sends it on
        ``bundle`` (the attacker's guess)."""
        return DChiText(bundle, self.eta)


class DChiText(_PolicyMixin, BaseMechanism):
    """Text-to-text privatization: the exact nearest regular token to x + N (§3.2.4)."""

    name = "dchi-text"
    Params = DChiParams
    payload_kind = PayloadKind.TOKENS
    family = "dchi"
    param_help = DCHI_HELP
    param_metavar = {"public_p": "P"}

    def __init__(self, bundle: EdgeBundle, eta: float, chunk: int = 256, *,
                 public_p: float | None = None):
        self.eta = positive("eta", eta)
        self.policy = policy_of(self.name, bundle, public_p)
        self.public_p = None if public_p is None else float(public_p)
        self.bundle = bundle
        # the bundle's privatization table: the model's word embeddings, or a designed table
        # (``shared.table``: a PCA projection, float32 or int8 dequantized)
        self._embeddings = np.asarray(bundle.table, dtype=np.float32)
        self._vocab_size = self._embeddings.shape[0]
        self._t_max = float(np.sqrt(np.einsum("ij,ij->i", self._embeddings,
                                              self._embeddings).max()))
        self.check_computable()
        self.exact = ExactNearest(  # the search on the CPU, which a torch twin wraps
            self._embeddings[bundle.regular_ids], ids=bundle.regular_ids, chunk=chunk
        )
        self.index: NearestIndex = self.exact  # the search privatize_ids runs

    def check_computable(self, bundle: EdgeBundle | None = None, *, dim: int | None = None,
                         float_dtype: str = "float32") -> None:
        """ValueError if η's noise would overflow the float32 nearest-token search
        (``shared.mechanisms.computable.check_dchi_eta``; the arguments are the protocol's,
        this object knows its table)."""
        check_dchi_eta(self.eta, self._embeddings.shape[1], self._t_max)

    def floor_text(self, bundle: EdgeBundle) -> DChiText:
        """What the privacy floor measures: this object's own output."""
        return self

    @classmethod
    def from_params(cls, params: Mapping[str, Any], bundle: EdgeBundle | None = None, *,
                    dim: int | None = None, secret: int | None = None) -> DChiText:
        if bundle is None:
            raise ValueError(f"{cls.name} needs the bundle (its embedding table)")
        return cls(bundle, need(cls.name, params, "eta"), public_p=params.get("public_p"))

    def privatize_tokens(self, ids: np.ndarray, bundle: EdgeBundle,
                         rng: np.random.Generator | None, *,
                         public: np.ndarray | None = None) -> np.ndarray:
        """One exact nearest-token search for the whole batch; ``bundle`` must be the one
        this object was built on; ``public``: the token policy's mask of the batch."""
        if bundle.bundle_id != self.bundle.bundle_id:
            raise ValueError("the DChiText mechanism was built for another bundle")
        return self.privatize_ids(ids, rng, public=public)

    def check_ids(self, ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """``ids`` as a 1-D int64 array inside the vocabulary, or ValueError."""
        a = np.asarray(ids)
        if a.ndim != 1:
            raise ValueError(f"ids must be a 1-D array of token ids, got shape {a.shape}")
        if a.size and a.dtype.kind not in "iu":
            raise ValueError(f"ids must be integers, got dtype {a.dtype}")
        a = a.astype(np.int64)
        if a.size and (a.min() < 0 or a.max() >= self._vocab_size):
            bad = a[(a < 0) | (a >= self._vocab_size)][0]
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self._vocab_size})")
        return a

    def noisy_embeddings(self, ids: npt.ArrayLike, rng: np.random.Generator | None = None
                         ) -> npt.NDArray[np.float64]:
        """phi(x) + N in float64 for each id: the input of the nearest-neighbour step."""
        a = self.check_ids(ids)
        x = self._embeddings[a].astype(np.float64)
        return x + sample_dchi_noise(a.size, x.shape[1], self.eta, rng)

    def privatize_ids(self, ids: npt.ArrayLike, rng: np.random.Generator | None = None, *,
                      public: np.ndarray | None = None) -> np.ndarray:
        """Privatized ids (L,), each one of ``bundle.regular_ids`` -- or, under a token
        policy, a public word sent as it is (``public``: the policy's mask of the batch,
        :func:`shared.policy.public_masks`; default: ``ids`` read as one text)."""
        if self.policy is None:
            y = self.noisy_embeddings(ids, rng)
            if y.shape[0] == 0:
                return np.empty(0, dtype=np.int64)
            return self.index.search(y)
        a = self.check_ids(ids)
        rng = resolve_rng(rng)
        keep = self.kept(a, public, rng)
        out = a.copy()
        priv = np.flatnonzero(~keep) if keep is not None else np.arange(a.size)
        if priv.size:
            out[priv] = self.index.search(_noise_rows(self._embeddings[a[priv]], self.eta, rng))
        return out


# -- its cost, floor and guarantee, registered in the registry's tables: ``shared.ledger``,
# ``shared.floor`` and ``shared.accounting`` find them there ---------------------------
@COST.register(DChiText, DChiEmbedding)
def _cost(cls: Any, params: Mapping[str, Any], *, tokens: int | None,
          dim: int | None, diameter: float | None, public: int = 0) -> Cost:
    eta = check_amount("eta", params["eta"])
    n = check_count("tokens", tokens)
    k = check_count("public tokens", public)
    if k > n:
        raise ValueError(f"public tokens ({k}) cannot exceed the tokens ({n})")
    if k and params.get("public_p") is None:
        raise ValueError("public tokens are counted only under a token policy (public_p)")
    if diameter is None:
        raise ValueError("the dχ cost needs the table's diameter D (bundle_diameter)")
    d = check_amount("table diameter", diameter)
    m = n - k
    return Cost(cls.family, finite_cost(cls.name, eta * m * d), metric=finite_cost(cls.name, eta * m),
                tokens=m, eta=eta, public=k)


@FLOOR.register(DChiEmbedding, DChiText)
def _floor(mech: DChiEmbedding | DChiText, bundle: EdgeBundle | None, *,
           threshold: float, dim: int | None,
           rng: np.random.Generator | None = None) -> str | None:
    if bundle is None and isinstance(mech, DChiText):
        bundle = mech.bundle
    if bundle is None:
        raise ValueError("dchi-embedding: pass the bundle to check the privacy floor (the "
                         "floor is measured on its embedding table)")
    if isinstance(mech, DChiEmbedding):
        bundle.embeddings  # noqa: B018 (BundleError: a designed table serves dchi-text only)
    head = msg.weak_head(msg.DCHI_WHAT.format(mechanism=mech.name, eta=mech.eta))
    problem = table_problem(bundle, rng)
    if problem is not None:
        return msg.DCHI_DEGENERATE.format(head=head, problem=problem)
    reg = np.asarray(bundle.regular_ids)
    t_max = float(np.sqrt(np.einsum("ij,ij->i", bundle.table[reg], bundle.table[reg]).max()))
    if not math.isfinite(mech.eta * 2.0 * t_max):
        return msg.DCHI_NOT_FINITE.format(head=head)
    same, drawn = measure_unchanged(mech, bundle, threshold=threshold, rng=rng)
    if same / drawn <= threshold:
        return None
    outcome = msg.DCHI_TEXT_OUTCOME if isinstance(mech, DChiText) else \
        msg.DCHI_EMBEDDING_OUTCOME
    start = dchi_floor(bundle, tokens=ESTIMATE_TOKENS, rng=rng).floor_eta(threshold)
    return msg.DCHI_MEASURED.format(head=head, share=msg.pct(same / drawn), drawn=drawn,
                                    outcome=outcome, floor=msg.pct(threshold), start=start)


@COMPUTABLE.register(DChiEmbedding)
def _computable(mech: DChiEmbedding, bundle: EdgeBundle | None, *,
                dim: int | None, float_dtype: str) -> None:
    if bundle is None:
        raise ValueError("dchi-embedding: pass the bundle to check eta against its table")
    emb = bundle.embeddings
    t_max = float(np.abs(emb).max()) if emb.size else 0.0
    check_dchi_eta(mech.eta, bundle.dim, t_max, float_dtype, search=False)


@GUARANTEE.register(DChiEmbedding, DChiText)
def _guarantee(mech: DChiEmbedding | DChiText, bundle: EdgeBundle | None, *, dim: int | None,
               sample: int) -> dict[str, Any]:
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
