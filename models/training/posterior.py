"""Channel posterior of the dχ mechanisms: what the server may infer about an original token
from its privatized form, knowing the mechanism exactly. Post-processing of the payload, so it
costs no privacy (Dwork & Roth 2014, Prop. 2.1); numpy only.

* ``dchi-text`` (Qu et al. 2021 §3.2.4): y is the regular token nearest to φ(x) + N. P(y | x)
  has no closed form (the noise's mass on y's Voronoi cell), so it is estimated by running the
  exact mechanism ``draws`` times on every distinct token of a public text; P(x) is the token
  frequency of that text. P(x | y) ∝ P(x)·P̂(y | x).
* ``dchi-embedding`` (§3.2.3): z = φ(x) + N has density ∝ exp(−η‖z − φ(x)‖), so
  P(x | z) ∝ P(x)·exp(−η‖z − φ(x)‖) exactly; only the prior P(x) is stored
  (``models.nets.classifiers`` computes the posterior inside the model).

The classifier reads the posterior-mean embedding E[φ(x) | y] (mixed with φ(y) by a learned
gate) instead of φ(y). A table is valid for one mechanism, η and bundle only:
:meth:`ChannelPosterior.check_for` refuses any other.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shared.mechanisms import DChiText, registry
from shared.policy import public_masks

POSTERIOR_FILE = "posterior.npz"
FORMAT = "privbert-posterior"
FORMAT_VERSION = 1
PRIOR_SMOOTHING = 0.5  # add-½ counts on every regular token for the embedding prior


def _sends_ids(mechanism: str) -> bool:
    """dχ-text sends token ids (a channel x -> y to count); dχ-embedding noisy rows."""
    return registry.get(mechanism).payload_kind is registry.PayloadKind.TOKENS


@dataclass
class ChannelPosterior:
    """Public-text prior counts and (``dchi-text``) Monte Carlo channel counts.

    ``pair_x``/``pair_y``/``pair_n``: how often the mechanism turned x into y over ``draws``
    runs per distinct token x of the public text (``dchi-text`` only; empty otherwise).
    """

    mechanism: str
    eta: float
    bundle_id: str
    vocab_size: int
    prior_counts: np.ndarray            # (V,) float64: token counts of the public text
    draws: np.ndarray | None = None    # (V,) int: mechanism runs per token (dchi-text)
    pair_x: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    pair_y: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    pair_n: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    source: dict = field(default_factory=dict)
    public_p: float | None = None  # the token policy's p (``shared.policy``), None: no policy

    def __post_init__(self) -> None:
        if self.mechanism not in registry.dchi_names():
            raise ValueError(f"a channel posterior exists for {', '.join(registry.dchi_names())} only, "
                             f"not {self.mechanism}")
        if not (math.isfinite(self.eta) and self.eta > 0):
            raise ValueError(f"eta must be finite and > 0, got {self.eta}")
        self.prior_counts = np.asarray(self.prior_counts, dtype=np.float64)
        if self.prior_counts.shape != (self.vocab_size,) or (self.prior_counts < 0).any() \
                or not np.isfinite(self.prior_counts).all():
            raise ValueError("prior counts must be finite, >= 0, one per vocabulary id")
        self.draws = (np.zeros(self.vocab_size, np.int64) if self.draws is None
                      else np.asarray(self.draws, dtype=np.int64))
        if self.draws.shape != (self.vocab_size,) or (self.draws < 0).any():
            raise ValueError("draws must be >= 0, one per vocabulary id")
        for name in ("pair_x", "pair_y", "pair_n"):
            setattr(self, name, np.asarray(getattr(self, name)))
        if not (len(self.pair_x) == len(self.pair_y) == len(self.pair_n)):
            raise ValueError("channel pair arrays differ in length")
        if len(self.pair_x) and (min(self.pair_x.min(), self.pair_y.min()) < 0 or
                                 max(self.pair_x.max(), self.pair_y.max()) >= self.vocab_size):
            raise ValueError("channel pairs hold ids outside the vocabulary")

    @property
    def _draws(self) -> np.ndarray:
        """``draws`` once built (``__post_init__`` turns None into zeros)."""
        if self.draws is None:
            raise RuntimeError("the channel posterior was not built")
        return self.draws

    # -- identity ------------------------------------------------------------------------------
    def describe(self) -> dict:
        """What the table is for and what it was built from (recorded in a model's config)."""
        return {"mechanism": self.mechanism, "eta": self.eta, "bundle_id": self.bundle_id,
                **({"public_p": self.public_p} if self.public_p is not None else {}),
                "draws": int(self._draws.sum()), "prior_tokens": int(self.prior_counts.sum()),
                "distinct_tokens": int((self.prior_counts > 0).sum()), **self.source}

    @property
    def params(self) -> dict:
        """The mechanism's parameters this table is for."""
        return {"eta": self.eta, **({"public_p": self.public_p}
                                    if self.public_p is not None else {})}

    def check_for(self, mechanism: str, params: dict, bundle_id: str) -> None:
        """ValueError unless this table was built for exactly this mechanism, η and bundle."""
        eta = (params or {}).get("eta")
        if mechanism != self.mechanism:
            raise ValueError(f"the posterior table was built for {self.mechanism}, not "
                             f"{mechanism}")
        if eta is None or abs(float(eta) - self.eta) > 1e-9 * self.eta:
            raise ValueError(f"the posterior table was built for eta={self.eta:g}, the "
                             f"payloads use eta={eta}")
        if bundle_id != self.bundle_id:
            raise ValueError(f"the posterior table was built for bundle {self.bundle_id[:12]}…,"
                             f" the payloads use {bundle_id[:12]}…")
        check_policy_param("posterior table", self.public_p, (params or {}).get("public_p"))

    # -- dchi-text: P(x | y) -------------------------------------------------------------------
    def pairs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, y, P(x | y)) for every observed pair (the posterior's support)."""
        if not _sends_ids(self.mechanism) or not len(self.pair_x):
            raise ValueError("no channel counts: the table is not a dchi-text one")
        x, y = self.pair_x.astype(np.int64), self.pair_y.astype(np.int64)
        joint = self.prior_counts[x] * self.pair_n / self._draws[x]  # ∝ P(x) P̂(y | x)
        total = np.zeros(self.vocab_size)
        np.add.at(total, y, joint)
        return x, y, joint / total[y]

    def mean_table(self, embeddings: np.ndarray) -> np.ndarray:
        """(V, n) float32: E[φ(x) | y] for every y the mechanism was seen to output, φ(y)
        elsewhere (special tokens, ids never produced)."""
        emb = np.asarray(embeddings, dtype=np.float64)
        if emb.shape[0] != self.vocab_size:
            raise ValueError(f"embedding table has {emb.shape[0]} rows, the posterior "
                             f"{self.vocab_size}")
        x, y, p = self.pairs()
        out = emb.copy()
        seen = np.zeros(self.vocab_size, dtype=bool)
        seen[y] = True
        out[seen] = 0.0
        np.add.at(out, y, p[:, None] * emb[x])
        return out.astype(np.float32)

    def map_ids(self) -> np.ndarray:
        """(V,) int64: argmax_x P(x | y) for every y seen, y itself elsewhere."""
        x, y, p = self.pairs()
        order = np.lexsort((-p, y))  # by y, then decreasing posterior
        first = np.ones(len(order), dtype=bool)
        first[1:] = y[order][1:] != y[order][:-1]
        out = np.arange(self.vocab_size, dtype=np.int64)
        out[y[order][first]] = x[order][first]
        return out

    # -- dchi-embedding: the prior -------------------------------------------------------------
    def log_prior(self, regular_ids: Sequence[int], smoothing: float = PRIOR_SMOOTHING
                  ) -> np.ndarray:
        """(V,) float32 log P(x): public-text counts plus ``smoothing`` on every regular token,
        −inf on the others (the edge privatizes text tokens; specials never reach it)."""
        c = np.zeros(self.vocab_size)
        reg = np.asarray(regular_ids, dtype=np.int64)
        c[reg] = smoothing
        c += self.prior_counts
        with np.errstate(divide="ignore"):
            return (np.log(c) - np.log(c.sum())).astype(np.float32)

    # -- files ---------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """The table as a compressed .npz (what :meth:`save` writes)."""
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "mechanism": self.mechanism,
                "eta": self.eta, "bundle_id": self.bundle_id, "vocab_size": self.vocab_size,
                "source": self.source, "public_p": self.public_p}
        buf = io.BytesIO()
        np.savez_compressed(buf, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
                            prior_counts=self.prior_counts,
                            draws=self._draws.astype(np.int32), pair_x=self.pair_x.astype(np.int32),
                            pair_y=self.pair_y.astype(np.int32),
                            pair_n=self.pair_n.astype(np.int32))
        return buf.getvalue()

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``path`` (an .npz, or a folder to hold posterior.npz) atomically."""
        p = Path(path)
        if p.is_dir():
            p = p / POSTERIOR_FILE
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_bytes(self.to_bytes())
        os.replace(tmp, p)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> ChannelPosterior:
        p = Path(path)
        if p.is_dir():
            p = p / POSTERIOR_FILE
        try:
            with np.load(p, allow_pickle=False) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                arrays = {k: z[k] for k in ("prior_counts", "draws", "pair_x", "pair_y",
                                           "pair_n")}
        except FileNotFoundError:
            raise ValueError(f"{p}: no such posterior table") from None
        except (OSError, KeyError, ValueError) as exc:
            raise ValueError(f"{p}: not a posterior table ({exc})") from None
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{p}: not a privbert posterior table of format {FORMAT_VERSION}")
        return cls(meta["mechanism"], float(meta["eta"]), meta["bundle_id"],
                   int(meta["vocab_size"]), arrays["prior_counts"], arrays["draws"],
                   arrays["pair_x"], arrays["pair_y"], arrays["pair_n"],
                   dict(meta.get("source") or {}), meta.get("public_p"))


def token_counts(bundle, texts: Sequence[str], public: bool = False
                 ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """(V,) float64 counts of the word pieces of ``texts`` as the edge tokenizes them;
    ``public``: also the counts of the occurrences that are public words under the bundle's
    token policy (``shared.policy``: whole words of its list)."""
    tok = bundle.text_tokenizer()
    counts = np.zeros(bundle.vocab_size)
    pub = np.zeros(bundle.vocab_size)
    for s in range(0, len(texts), 4096):
        enc = tok.encode_batch(list(texts[s:s + 4096]), add_special_tokens=False)
        ids = [np.asarray(e.ids, dtype=np.int64) for e in enc]
        if ids:
            flat = np.concatenate(ids)
            np.add.at(counts, flat, 1.0)
            if public and bundle.policy is not None:
                np.add.at(pub, flat[public_masks(bundle.policy, ids)], 1.0)
    return (counts, pub) if public else counts


def check_policy_param(what: str, have: float | None, sent: float | None) -> None:
    """ValueError unless a table (or denoiser) built for token policy ``have`` (its p, None:
    no policy) is used for payloads of policy ``sent``."""
    if (have is None) != (sent is None) or (
            have is not None and abs(float(have) - float(sent)) > 1e-9):  # type: ignore[arg-type]
        def say(p: float | None) -> str:
            return "no token policy" if p is None else f"token policy public_p={p:g}"
        raise ValueError(f"the {what} was built for {say(have)}, the payloads use {say(sent)}")


def draws_per_token(counts: np.ndarray, passes: float, min_draws: int) -> np.ndarray:
    """Mechanism runs per token: ``passes`` × its count in the text, at least ``min_draws`` for
    every token the text holds. Fewer runs than occurrences would overstate a frequent token's
    rare outputs (one stray draw of 30,000 "the" in 32 runs weighs 940 occurrences) and make
    the posterior's argmax worse than the privatized token itself."""
    d = np.ceil(np.asarray(counts, dtype=np.float64) * passes).astype(np.int64)
    d[counts > 0] = np.maximum(d[counts > 0], min_draws)
    return d


def build_posterior(bundle, mechanism: str, eta: float, texts: Sequence[str], *,
                    passes: float = 1.0, min_draws: int = 16,
                    rng: np.random.Generator | None = None, source: dict | None = None,
                    chunk: int = 65536,
                    on_progress: Callable[[int, int], None] | None = None,
                    public_p: float | None = None) -> ChannelPosterior:
    """The channel posterior of ``mechanism`` at ``eta`` on ``bundle`` from public ``texts``.

    ``dchi-text``: the exact mechanism (``shared.mechanisms.DChiText``) runs on every token
    of the texts (:func:`draws_per_token`: ``passes`` times each occurrence, ``min_draws``
    runs at least per distinct token); cost ≈ one search per run. Under a token policy
    (``public_p``) a token's runs are public in the share its occurrences in the text are
    public words (sent as they are with probability 1 − p).
    ``dchi-embedding``: the prior only (no sampling).
    """
    if mechanism not in registry.dchi_names():
        raise ValueError(f"a channel posterior makes no sense for {mechanism}: only "
                         f"{', '.join(registry.dchi_names())} privatize tokens one by one")
    if not (passes > 0 and math.isfinite(passes)) or min_draws < 1:
        raise ValueError(f"passes must be > 0 and min_draws >= 1, got {passes}, {min_draws}")
    counts, pub_counts = token_counts(bundle, texts, public=True)
    if counts.sum() == 0:
        raise ValueError("the public text has no tokens: no posterior can be built")
    src = {"texts": len(texts), "passes": passes, "min_draws": min_draws, **(source or {})}
    if not _sends_ids(mechanism):  # noisy embeddings: the prior only
        return ChannelPosterior(mechanism, float(eta), bundle.bundle_id, bundle.vocab_size,
                                counts, source=src, public_p=public_p)

    mech = DChiText(bundle, eta, public_p=public_p)
    draws = draws_per_token(counts, passes, min_draws)
    xs = np.repeat(np.arange(bundle.vocab_size, dtype=np.int64), draws)
    public = None
    if mech.policy is not None:  # the first round(d·share) runs of each token are public
        share = np.divide(pub_counts, counts, out=np.zeros_like(counts), where=counts > 0)
        n_pub = np.rint(draws * share).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(draws)[:-1]])
        public = (np.arange(xs.size) - np.repeat(starts, draws)) < np.repeat(n_pub, draws)
    ys = np.empty_like(xs)
    for s in range(0, len(xs), chunk):
        ys[s:s + chunk] = mech.privatize_ids(
            xs[s:s + chunk], rng, public=None if public is None else public[s:s + chunk])
        if on_progress is not None:
            on_progress(min(len(xs), s + chunk), len(xs))
    code, n = np.unique(xs * bundle.vocab_size + ys, return_counts=True)
    return ChannelPosterior(mechanism, float(eta), bundle.bundle_id, bundle.vocab_size,
                            counts, draws, (code // bundle.vocab_size).astype(np.int32),
                            (code % bundle.vocab_size).astype(np.int32), n.astype(np.int32),
                            source=src, public_p=public_p)
