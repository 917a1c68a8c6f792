"""The privacy report that helps a user choose η (Qu et al. 2021 §5.3–5.4).

* Plausible deniability (§5.3, after Feyisetan et al. 2020): each of N sampled
  regular tokens is privatized K times with text-to-text dχ-privacy; N_w counts
  the outputs equal to the input, S_w the distinct outputs. Small N_w and large
  S_w mean good deniability. All N·K perturbations go through the exact
  nearest-token search of ``DChiText`` in large batches, then numpy counts.
* Token embedding inversion (§5.4): the nearest regular token of a perturbed
  embedding is the attacker's guess; accuracy over the tokens of a sample text
  (token frequencies count) or of the vocabulary. For a table over η and for
  ``target_eta`` the noise is drawn once (unit directions and Gamma(n, 1)
  radii, ``sample_dchi_noise`` at η = 1) and scaled by 1/η. Each token's cell of
  the nearest-token partition is convex, so along a fixed direction the guess
  stays right up to one radius: accuracy is monotone in η on that draw and a
  bisection finds a stable η.

Both statistics describe ``dchi-text`` and ``dchi-embedding`` alike: the
nearest-token step is what an attacker applies to a perturbed embedding.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from shared.accounting import summary
from shared.bundle import EdgeBundle
from shared.floor import THRESHOLD, dchi_floor
from shared.mechanisms import DChiText, registry, sample_dchi_noise
from shared.mechanisms.nearest import kth_neighbour_distances
from shared.recovery import TokenClasses, token_classes

PAPER_ETAS = (50, 75, 100, 125, 150, 175)  # Qu et al. Table 3, BERT-base (n = 768)
GEOMETRY_KS = (1, 2, 3, 4, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 10000)  # Fig. 3


def default_etas(dim: int) -> list[float]:
    """The paper's η grid scaled to this dimension (E||N|| = n/η stays the same)."""
    return [round(e * dim / 768, 4) for e in PAPER_ETAS]


def sample_regular_tokens(bundle: EdgeBundle, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` distinct regular token ids drawn uniformly (all of them if n >= their number)."""
    reg = bundle.regular_ids
    if n >= reg.size:
        return np.array(reg, dtype=np.int64)
    return np.sort(rng.choice(reg, size=n, replace=False)).astype(np.int64)


def text_token_sample(bundle: EdgeBundle, texts: list[str], limit: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, TokenClasses]:
    """Regular word-piece occurrences of ``texts`` (a random subset of ``limit`` if more),
    and their classes (``shared.recovery``: content tokens by the standard stop list, rare
    tokens outside the 4,096 most frequent of ``texts`` themselves).

    [UNK] and other special ids are left out: no mechanism output is ever one of them.
    """
    encs = bundle.tokenizer.encode_batch(texts, add_special_tokens=False)
    seqs = [np.asarray(e.ids, dtype=np.int64) for e in encs]
    ids = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
    counts = np.bincount(ids, minlength=bundle.vocab_size).astype(np.float64)
    classes = token_classes(seqs, bundle.tokenizer.get_vocab(with_added_tokens=True),
                            bundle.regular_ids, counts)
    keep = np.flatnonzero(np.isin(ids, bundle.regular_ids))
    if keep.size > limit:
        keep = np.sort(rng.choice(keep, size=limit, replace=False))
    return ids[keep], TokenClasses({k: v[keep] for k, v in classes.masks.items()})


def distinct_per_row(values: np.ndarray) -> np.ndarray:
    """Number of distinct values in each row of a 2-D integer array."""
    srt = np.sort(values, axis=1)
    return 1 + (np.diff(srt, axis=1) != 0).sum(axis=1)


def plausible_deniability(mech: DChiText, ids: np.ndarray, k: int, rng: np.random.Generator,
                          max_queries: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """(N_w, S_w) for each token of ``ids`` over ``k`` perturbations (Qu et al. §5.3)."""
    if k < 1:
        raise ValueError(f"samples K must be an integer >= 1, got {k!r}")
    ids = np.asarray(ids, dtype=np.int64)
    n_w = np.empty(ids.size, dtype=np.int64)
    s_w = np.empty(ids.size, dtype=np.int64)
    per = max(1, max_queries // k)  # tokens per privatize_ids call
    for s in range(0, ids.size, per):
        block = ids[s : s + per]
        out = mech.privatize_ids(np.repeat(block, k), rng).reshape(block.size, k)
        n_w[s : s + block.size] = (out == block[:, None]).sum(axis=1)
        s_w[s : s + block.size] = distinct_per_row(out)
    return n_w, s_w


class FixedDraw:
    """Inversion accuracy as a function of η on one fixed noise draw (Qu et al. §5.4)."""

    def __init__(self, mech: DChiText, ids: np.ndarray, rng: np.random.Generator):
        self.mech = mech
        self.ids = np.asarray(ids, dtype=np.int64)
        if self.ids.size == 0:
            raise ValueError("no regular tokens to measure inversion on")
        emb = mech.bundle.table
        self._x = emb[self.ids].astype(np.float64)
        # radius ~ Gamma(n, 1), direction uniform: the dχ noise at η = 1; N/η is the noise at η
        self._base = sample_dchi_noise(self.ids.size, emb.shape[1], 1.0, rng)
        self.evaluations = 0

    def accuracy(self, eta: float) -> float:
        """Share of tokens whose perturbed embedding's nearest regular token is the token."""
        if not (eta > 0 and math.isfinite(eta)):
            raise ValueError(f"eta must be a finite number > 0, got {eta!r}")
        self.evaluations += 1
        guess = self.mech.index.search(self._x + self._base / eta)
        return float((guess == self.ids).mean())

    def accuracy_by_class(self, eta: float, classes: TokenClasses) -> dict[str, float | None]:
        """:meth:`accuracy` within each class of ``classes`` (masks over the ids)."""
        hit = self.mech.index.search(self._x + self._base / eta) == self.ids
        return {c: (float(hit[m].mean()) if m.any() else None)
                for c, m in classes.masks.items()}

    def standard_error(self, acc: float) -> float:
        """Binomial standard error of an accuracy estimated on this many tokens."""
        return math.sqrt(max(acc * (1 - acc), 0.0) / self.ids.size)


def target_eta(draw: FixedDraw, target: float, tol: float = 0.005, start: float | None = None,
               max_evals: int = 80) -> tuple[float, float]:
    """(η, accuracy) with accuracy within ``tol`` of ``target``, by bisection in log η.

    If no η gets that close (a step of 1/N is wider than 2·tol), the closest found.
    """
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"target inversion accuracy must be in [0, 1], got {target!r}")
    seen: dict[float, float] = {}

    def acc(eta: float) -> float:
        if eta not in seen:
            seen[eta] = draw.accuracy(eta)
        return seen[eta]

    def best() -> tuple[float, float]:
        eta = min(seen, key=lambda e: (abs(seen[e] - target), e))
        return eta, seen[eta]

    lo = hi = start or draw.mech.bundle.table_dim / 6.0
    while acc(hi) < target - tol and len(seen) < max_evals // 2 and hi < 1e12:
        lo, hi = hi, hi * 2.0
    while acc(lo) > target + tol and len(seen) < max_evals // 2 and lo > 1e-12:
        lo, hi = lo / 2.0, lo
    for _ in range(max_evals):
        eta, a = best()
        if abs(a - target) <= tol or hi / lo < 1 + 1e-9:
            break
        mid = math.sqrt(lo * hi)
        if acc(mid) < target:
            lo = mid
        else:
            hi = mid
    return best()


def histogram(values: np.ndarray, k: int, bins: int = 10) -> list[tuple[int, int, int]]:
    """(lowest, highest integer, count) of ``bins`` equal buckets over [0, k]."""
    edges = np.linspace(0, k, bins + 1)
    counts, _ = np.histogram(values, bins=edges)  # [a, b) buckets, the last one [a, b]
    return [(int(math.ceil(edges[i])),
             int(math.floor(edges[i + 1])) if i == bins - 1 else int(math.ceil(edges[i + 1])) - 1,
             int(c)) for i, c in enumerate(counts)]


@dataclass
class PrivacyReport:
    """Everything ``edge-agent report`` prints (and ``--json`` writes)."""

    mechanism: str
    eta: float
    bundle_id: str
    dim: int
    n_regular: int
    tokens: int
    samples: int
    n_w: np.ndarray
    s_w: np.ndarray
    inversion_source: str
    inversion_tokens: int
    inversion_accuracy: float
    inversion_se: float
    table: list[tuple[float, float]]
    target: float | None = None
    guarantee: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    geometry: dict | None = None
    floor: dict | None = None  # shared.floor: {"threshold", "eta", "unchanged"}
    by_class: dict | None = None  # inversion accuracy per token class (a sample text only)

    def summary_stats(self) -> dict:
        """min / quantiles / max / mean of N_w and S_w."""
        def stats(v: np.ndarray) -> dict:
            q = np.percentile(v, [10, 50, 90])
            return {"min": int(v.min()), "p10": float(q[0]), "median": float(q[1]),
                    "p90": float(q[2]), "max": int(v.max()), "mean": float(v.mean())}

        return {"n_w": stats(self.n_w), "s_w": stats(self.s_w)}

    def to_json(self) -> dict:
        return {
            "mechanism": self.mechanism, "eta": self.eta, "bundle_id": self.bundle_id,
            "dim": self.dim, "regular_tokens": self.n_regular, "tokens": self.tokens,
            "samples": self.samples, "n_w": self.n_w.tolist(), "s_w": self.s_w.tolist(),
            "stats": self.summary_stats(),
            "inversion": {"source": self.inversion_source, "tokens": self.inversion_tokens,
                          "accuracy": self.inversion_accuracy,
                          "standard_error": self.inversion_se,
                          "table": [{"eta": e, "accuracy": a} for e, a in self.table]},
            "target_inversion": self.target, "guarantee": self.guarantee,
            "timings_s": self.timings, "geometry": self.geometry,
            "privacy_floor": self.floor, "inversion_by_class": self.by_class,
            "contextual_attack": (None if not _contextual(self.mechanism) else
                                  {"measured": False, "how": CONTEXTUAL_NOTE.split(": ", 1)[1]
                                   .split("torch: ", 1)[1].format(eta=f"{self.eta:.4g}")}),
        }


def build_report(bundle: EdgeBundle, mechanism: str, *, eta: float | None = None,
                 target: float | None = None, texts: list[str] | None = None,
                 tokens: int = 500, samples: int = 1000, inversion_tokens: int = 5000,
                 etas: list[float] | None = None, rng: np.random.Generator | None = None,
                 geometry: bool = False, tol: float = 0.005, progress=None,
                 mech: DChiText | None = None, max_queries: int = 20_000) -> PrivacyReport:
    """The full report at ``eta``, or at the η whose inversion accuracy is ``target``.

    ``mech`` lets a caller pass a ``DChiText`` whose search runs elsewhere (the server's
    torch index on a GPU); its η is set here. ``max_queries`` bounds one search call.
    """
    if (eta is None) == (target is None):
        raise ValueError("give either eta or a target inversion accuracy")
    if mechanism not in registry.dchi_names():  # dχ-privacy, token by token
        raise ValueError(f"the report covers {' and '.join(registry.dchi_names())}, got "
                         f"{mechanism!r}")
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens N must be an integer >= 1, got {tokens!r}")
    if not isinstance(inversion_tokens, int) or inversion_tokens < 1:
        raise ValueError(f"inversion tokens must be an integer >= 1, got {inversion_tokens!r}")
    rng = rng if rng is not None else np.random.default_rng()
    timings: dict[str, float] = {}
    note = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    # the index does not depend on η; chunks of 1,024 queries keep the GEMM efficient
    if mech is None:
        mech = DChiText(bundle, eta if eta is not None else 1.0, chunk=1024)
    elif eta is not None:
        mech.eta = float(eta)
    classes = None
    if texts is not None:
        inv_ids, classes = text_token_sample(bundle, texts, inversion_tokens, rng)
        source = "sample text"
    else:
        inv_ids = rng.choice(bundle.regular_ids, size=inversion_tokens, replace=True)
        source = "vocabulary (uniform)"
    draw = FixedDraw(mech, inv_ids, rng)
    if target is not None:
        note(f"finding eta for inversion accuracy {target:g} on {inv_ids.size} tokens")
        eta, _ = target_eta(draw, target, tol=tol)
        mech.eta = float(eta)  # the same index serves every η: no second build
        timings["target_eta"] = time.perf_counter() - t0
    eta = cast(float, eta)  # given, or found for the target
    grid = sorted({float(e) for e in (etas or default_etas(bundle.table_dim))} | {float(eta)})
    t1 = time.perf_counter()
    table = [(e, draw.accuracy(e)) for e in grid]
    acc = dict(table)[float(eta)]
    by_class = None
    if classes is not None:
        by_class = {"accuracy": draw.accuracy_by_class(float(eta), classes),
                    "tokens": classes.sizes(),
                    "rare": "outside the 4,096 most frequent tokens of the sample text"}
    timings["inversion_table"] = time.perf_counter() - t1
    note(f"plausible deniability: {tokens} tokens x {samples} perturbations at eta={eta:g}")
    t2 = time.perf_counter()
    ids = sample_regular_tokens(bundle, tokens, rng)
    n_w, s_w = plausible_deniability(mech, ids, samples, rng, max_queries=max_queries)
    timings["plausible_deniability"] = time.perf_counter() - t2
    geo = None
    if geometry:
        geo = embedding_geometry(bundle, rng, grid)
    g = (mech if mech.name == mechanism else registry.create(mechanism, {"eta": eta})
         ).guarantee(bundle)
    t3 = time.perf_counter()
    fl = dchi_floor(bundle, rng=rng)
    floor = {"threshold": THRESHOLD, "eta": fl.floor_eta(THRESHOLD),
             "unchanged": fl.unchanged(float(eta)), "tokens": int(fl.exit.size)}
    timings["privacy_floor"] = time.perf_counter() - t3
    timings["total"] = time.perf_counter() - t0
    return PrivacyReport(mechanism, float(eta), bundle.bundle_id, bundle.table_dim,
                         int(bundle.regular_ids.size), int(ids.size), samples, n_w, s_w,
                         source, int(inv_ids.size), acc, draw.standard_error(acc), table,
                         target, g, timings, geo, floor, by_class)


def embedding_geometry(bundle: EdgeBundle, rng: np.random.Generator, etas: list[float],
                       rows: int = 500) -> dict:
    """Qu et al. Fig. 3: mean distance to the k-th nearest token, and n/η for each η."""
    table = bundle.table[bundle.regular_ids]
    ks = tuple(k for k in GEOMETRY_KS if k < table.shape[0])
    sample = rng.choice(table.shape[0], size=min(rows, table.shape[0]), replace=False)
    d = kth_neighbour_distances(table, sample, ks)
    return {"k": list(ks), "mean_distance": [float(d[k].mean()) for k in ks],
            "noise_norm": {str(e): bundle.table_dim / e for e in etas}}


CONTEXTUAL_NOTE = (
    "contextual attack: the inversion above reads each token alone; a server with a contextual "
    "model of public text (a denoiser reading the whole privatized sentence) recovers more "
    "tokens at the same eta. That figure is measured on the server, which has torch: "
    "cloud-api evaluate --attack --mechanism dchi-text --eta {eta} --data TEXT.tsv "
    "--denoiser MODEL_VERSION_OR_FILE")


def format_report(r: PrivacyReport) -> str:
    """The report as plain text."""
    st = r.summary_stats()
    lines = [
        f"privacy report: {r.mechanism}, eta={r.eta:.4g} (bundle {r.bundle_id[:12]}…, "
        f"n={r.dim}, {r.n_regular:,} regular tokens)",
        "",
        f"plausible deniability (Qu et al. §5.3): {r.tokens} regular tokens x {r.samples} "
        "perturbations",
    ]
    for key, label in (("n_w", "N_w (outputs equal to the input)"),
                       ("s_w", "S_w (distinct outputs)")):
        s = st[key]
        lines.append(f"  {label}: min {s['min']}, p10 {s['p10']:g}, median {s['median']:g}, "
                     f"p90 {s['p90']:g}, max {s['max']}, mean {s['mean']:.1f}")
    lines.append(f"  worst case: no token came back unchanged more than {st['n_w']['max']} "
                 f"times of {r.samples}; none had fewer than {st['s_w']['min']} distinct outputs")
    lines.append("  distribution   N_w tokens   S_w tokens")
    for (lo, hi, cn), (_, _, cs) in zip(histogram(r.n_w, r.samples),
                                         histogram(r.s_w, r.samples), strict=True):
        lines.append(f"  {lo:>5}-{hi:<6} {cn:>10} {cs:>12}")
    lines += [
        "",
        f"token embedding inversion (Qu et al. §5.4) on {r.inversion_tokens:,} tokens of the "
        f"{r.inversion_source}: accuracy {r.inversion_accuracy:.4f} "
        f"(± {1.96 * r.inversion_se:.4f}, 95%) at eta={r.eta:.4g}",
    ]
    if r.by_class is not None:
        acc, n = r.by_class["accuracy"], r.by_class["tokens"]
        lines.append("  by token class: " + ", ".join(
            f"{c} {'-' if acc[c] is None else f'{acc[c]:.4f}'} ({n[c]:,} tokens)"
            for c in ("all", "content", "rare")) + " (content: not a word of the standard "
            f"stop list; rare: {r.by_class['rare']})")
    if r.target is not None:
        lines.append(f"  target {r.target:g}: eta={r.eta:.4g} reaches {r.inversion_accuracy:.4f} "
                     "on the fixed noise draw")
    lines.append("  eta        accuracy   E||N|| = n/eta")
    for e, a in r.table:
        mark = "  <-" if e == r.eta else ""
        lines.append(f"  {e:<10.4g} {a:<10.4f} {r.dim / e:<8.3f}{mark}")
    if r.floor is not None:
        f = r.floor
        where = (f"from eta={f['eta']:.4g} on" if math.isfinite(f["eta"]) else "at no eta")
        lines += ["", f"privacy floor (shared.floor): {where} more than "
                  f"{100 * f['threshold']:g}% of tokens come back unchanged on this bundle; "
                  "edge-agent privatize refuses such an eta without --allow-weak-privacy",
                  f"  at eta={r.eta:.4g}: {100 * f['unchanged']:.2f}% unchanged (estimated on "
                  f"{f['tokens']:,} tokens, each with one noise direction, drawn afresh)"]
    lines += ["", "guarantee: " + summary(r.guarantee)]
    lines += [f"  - {n}" for n in r.guarantee.get("notes", [])]
    if _contextual(r.mechanism):
        lines += ["", CONTEXTUAL_NOTE.format(eta=f"{r.eta:.4g}")]
    lines.append(f"(computed in {r.timings.get('total', 0):.1f} s)")
    return "\n".join(lines)


def _contextual(mechanism: str) -> bool:
    """Whether the server's contextual denoiser attacks this mechanism's output."""
    return registry.substitutes_tokens(registry.get(mechanism))


def plot_report(r: PrivacyReport, path: str) -> None:
    """PNG like Qu et al. Fig. 3–4: N_w and S_w histograms, accuracy vs η, geometry."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 4 if r.geometry else 3
    fig, axes = plt.subplots(1, panels, figsize=(4.8 * panels, 4.2))
    bins = np.linspace(0, r.samples, 21)
    axes[0].hist(r.n_w, bins=bins, color="tab:red")
    axes[0].set(title=f"N_w, eta={r.eta:.4g}", xlabel=f"outputs equal to input (of {r.samples})",
                ylabel="tokens")
    axes[1].hist(r.s_w, bins=bins, color="tab:blue")
    axes[1].set(title=f"S_w, eta={r.eta:.4g}", xlabel=f"distinct outputs (of {r.samples})",
                ylabel="tokens")
    etas, accs = zip(*r.table, strict=True)
    axes[2].plot(etas, accs, "o-")
    axes[2].axvline(r.eta, color="gray", ls="--")
    if r.target is not None:
        axes[2].axhline(r.target, color="gray", ls=":")
    if r.floor is not None and math.isfinite(r.floor["eta"]):
        if r.floor["eta"] <= 1.5 * max(etas):
            axes[2].axvline(r.floor["eta"], color="tab:red", ls=":",
                            label=f"privacy floor, eta={r.floor['eta']:.4g}")
            axes[2].legend(fontsize=8, loc="lower right")
        else:  # far right of the grid: a note, not an axis squeezed to show it
            axes[2].text(0.98, 0.04, f"privacy floor at eta={r.floor['eta']:.4g} (off axis)",
                         transform=axes[2].transAxes, ha="right", fontsize=8,
                         color="tab:red")
    axes[2].set(title="token embedding inversion", xlabel="eta", ylabel="accuracy", ylim=(0, 1))
    if r.geometry:
        g = r.geometry
        ax = axes[3]
        ax.semilogx(g["k"], g["mean_distance"], "o-", color="black",
                    label="mean distance to the k-th nearest token")
        cmap = plt.get_cmap("viridis")
        norms = list(g["noise_norm"].items())
        for i, (e, norm) in enumerate(norms):
            ax.axhline(norm, color=cmap(i / max(1, len(norms) - 1)), lw=1.2,
                       ls="--" if float(e) == r.eta else "-",
                       label=f"noise norm n/eta = {norm:.2f} (eta={float(e):.4g})")
        ax.set(title="embedding geometry vs noise", xlabel="k (k-th nearest token)",
               ylabel="Euclidean distance")
        ax.legend(fontsize=7, loc="upper left", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
