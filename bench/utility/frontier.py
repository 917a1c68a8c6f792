"""The privacy–utility frontier of the privatization table (``shared.table``), judged at
matched privacy by the strongest attacks we have.

    python -m bench.utility frontier sweep  [--tables none,pca64-int8,pca32-int8,pca16-int8]
                                            [--etas-TABLE 40,50,60] [--out out/frontier]
    python -m bench.utility frontier match  [--reference none:65] [--out out/frontier]
    python -m bench.utility frontier train  --table T --eta E [--n 10000] [--epochs 3]
    python -m bench.utility frontier denoise --table T --eta E [--epochs 1]
    python -m bench.utility frontier report [--png docs/frontier.png]

* ``sweep`` (cheap, numpy): for each table and η, on the tokens of
  ``sst2_sentences/dev.tsv`` privatized afresh 3 times: the share that survives unchanged,
  the share the **context-free Bayes attack** recovers (argmax_x P(x)·P̂(y|x), the channel
  estimated by Monte Carlo on the training text's tokens -- draws held apart from the
  attacked ones -- as ``cloud-api train`` builds it: 1 pass, 16 runs at least per distinct
  token, seed 7), and the worst-case ε per token, η·D with D the diameter bound of *this*
  table. The channel table is kept (``post-TABLE-ETA.npz``): training reads it.
* ``match``: for each table, the η whose context-free recovery equals the reference's (the
  384-d table at η 65) -- interpolated in log η between swept points, then swept to check.
* ``train``: the recipe of ``bench.utility explore`` (fresh noise each epoch + the channel
  posterior, lr 1e-4, batch 32) on ``--n`` rows of ``sst2_sentences/train.tsv``; whole
  sentences (``sst2_sentences/dev.tsv``, mean of 3 fresh draws) and phrases (first 2,000 of
  ``sst2/dev.tsv``).
* ``denoise``: the contextual denoiser (``models.attacks.denoiser``) retrained for that table and η
  on public text (agnews + the training sentences), and its recovery on the dev tokens.
* ``report``: one row per (table, η) with everything measured, the matched η of each table
  with its accuracy, and a PNG of accuracy against the strongest attack's recovery.

Every step appends JSON lines to ``OUT/results.jsonl``; ``report`` reads them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.common import DATA, machine
from bench.utility.cache import log
from shared.policy import DEFAULT_P, NO_POLICY, RARE_FROM
from shared.table import candidate_key

DEFAULT_TABLES = ("none", "pca64-int8", "pca32-int8", "pca16-int8")
REFERENCE = ("none", 65.0)
DEFAULT_ETAS = {"none": (55.0, 60.0, 65.0, 70.0), "pca64-int8": (35.0, 42.0, 50.0),
                "pca32-int8": (25.0, 32.0, 40.0, 48.0), "pca16-int8": (12.0, 16.0, 20.0, 26.0)}
DRAWS = 3
TOP = 5  # ranked guesses kept per token (top-5 recovery)


@dataclass(frozen=True)
class Candidate:
    """A frontier row's mechanism besides η: the privatization table and the token policy
    (``shared.policy``: its name and p, the probability that a public word is privatized)."""

    table: str
    policy: str = NO_POLICY
    p: float | None = None

    @property
    def key(self) -> str:
        """"pca32-int8", or "pca32-int8+function-words@0.3" under a policy."""
        return candidate_key(self.table, self.policy, self.p)

    @classmethod
    def parse(cls, key: str) -> Candidate:
        if "+" not in key:
            return cls(key)
        table, rest = key.split("+", 1)
        policy, _, p = rest.partition("@")
        return cls(table, policy, float(p) if p else DEFAULT_P)

    def params(self, eta: float) -> dict:
        return {"eta": eta, **({"public_p": self.p} if self.policy != NO_POLICY else {})}


_BUNDLES: dict[tuple[str, str], object] = {}


def bundle_for(cand: Candidate | str):
    from shared.bundle import EdgeBundle

    c = Candidate.parse(cand) if isinstance(cand, str) else cand
    k = (c.table, c.policy)
    if k not in _BUNDLES:
        _BUNDLES[k] = EdgeBundle.from_model(table=None if c.table == "none" else c.table,
                                            policy=c.policy)
    return _BUNDLES[k]


def _append(out: Path, rec: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _records(out: Path) -> list[dict]:
    p = out / "results.jsonl"
    if not p.exists():
        return []
    recs = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    for r in recs:  # rows of the first frontier name their table only
        r.setdefault("candidate", r["table"])
    return recs


def posterior_path(out: Path, cand: Candidate, eta: float) -> Path:
    return out / f"post-{cand.key}-{eta:.4g}.npz"


def tokens_path(out: Path, cand: Candidate, eta: float, what: str) -> Path:
    return out / "tokens" / f"{cand.key}-{eta:.4g}-{what}.npz"


def load_or_build_posterior(out: Path, bundle, cand: Candidate, eta: float):
    from models.training.data import read_labelled_tsv
    from models.training.posterior import ChannelPosterior, build_posterior

    p = posterior_path(out, cand, eta)
    if p.exists():
        return ChannelPosterior.load(p)
    whole = read_labelled_tsv(DATA / "sst2_sentences" / "train.tsv")
    post = build_posterior(bundle, "dchi-text", eta, whole.texts, passes=1.0, min_draws=16,
                           rng=np.random.default_rng(7), public_p=cand.params(eta).get("public_p"))
    p.parent.mkdir(parents=True, exist_ok=True)
    post.save(p)
    return post


def top_guesses(post, k: int = TOP) -> np.ndarray:
    """(V, k) the context-free attack's ranked guesses for every output y: the k most
    probable originals by P(x | y) (the posterior's support), y itself first where it has
    none; −1 pads a shorter support."""
    x, y, p = post.pairs()
    order = np.lexsort((-p, y))
    xs, ys = x[order], y[order]
    start = np.searchsorted(ys, np.arange(post.vocab_size + 1))
    out = np.full((post.vocab_size, k), -1, dtype=np.int64)
    out[:, 0] = np.arange(post.vocab_size)
    have = np.flatnonzero(start[1:] > start[:-1])
    for j in range(k):
        at = start[have] + j
        ok = at < start[have + 1]
        out[have[ok], j] = xs[at[ok]]
    return out


_DEV: dict[str, tuple] = {}


def dev_tokens(bundle, post):
    """The dev tokens (one array per sentence, as the frontier privatizes them), their
    classes (``shared.recovery``: the same tokens for every candidate) and the semantic
    neighbours of each in MiniLM's 384-d table."""
    from models.attacks.denoiser_train import token_sequences
    from models.training.data import read_labelled_tsv
    from shared.recovery import neighbour_table, token_classes

    if "dev" not in _DEV:
        dev = read_labelled_tsv(DATA / "sst2_sentences" / "dev.tsv")
        seqs = token_sequences(bundle, dev.texts, 128)
        vocab = bundle.tokenizer.get_vocab(with_added_tokens=True)
        classes = token_classes(seqs, vocab, bundle.regular_ids, post.prior_counts, RARE_FROM)
        ref = bundle_for(Candidate(REFERENCE[0]))
        x = np.concatenate(seqs)
        _DEV["dev"] = (seqs, classes, neighbour_table(ref.table, x, ref.regular_ids))
    return _DEV["dev"]


def split(x: np.ndarray, guesses: np.ndarray, classes, neighbours) -> dict:
    from shared.recovery import recovery_by_class

    return recovery_by_class(x, guesses, classes, neighbours)


def mean_split(splits: list[dict]) -> dict:
    """The mean over draws of :func:`split`'s {class: {measure: share}}."""
    out: dict = {}
    for c in splits[0]:
        out[c] = {m: (float(np.mean([s[c][m] for s in splits]))
                      if splits[0][c][m] is not None else None)
                  for m in splits[0][c] if m != "tokens"}
        out[c]["tokens"] = splits[0][c]["tokens"]
    return out


def sweep_point(out: Path, cand: Candidate, eta: float, draws: int = DRAWS) -> dict:
    """Survival, the context-free attack's recovery (exact, top-5, semantic) by token class
    (``shared.recovery``) and the worst-case ε of one (candidate, η); the share of the whole
    vocabulary left unchanged (uniform over the regular tokens: the floor's quantity,
    ``shared.floor.DChiFloor``). The tokens, outputs and guesses are kept under
    ``OUT/tokens`` for the report."""
    from models.attacks.denoiser_train import privatize_sequences
    from shared.accounting import dchi_diameter_bound
    from shared.floor import DChiFloor
    from shared.mechanisms import DChiText
    from shared.recovery import unchanged_by_class

    bundle = bundle_for(cand)
    t0 = time.time()
    post = load_or_build_posterior(out, bundle, cand, eta)
    t1 = time.time()
    seqs, classes, near = dev_tokens(bundle, post)
    x = np.concatenate(seqs)
    mech = DChiText(bundle, eta, public_p=cand.params(eta).get("public_p"))
    guesses = top_guesses(post)
    rng = np.random.default_rng([31, 7])  # the draws models.attacks.denoiser_train.recovery makes
    ys, splits, unchanged = [], [], []
    for _ in range(draws):
        y = np.concatenate(privatize_sequences(mech, seqs, rng))
        ys.append(y)
        splits.append(split(x, guesses[y], classes, near))
        unchanged.append(unchanged_by_class(x, y, classes))
    p = tokens_path(out, cand, eta, "sweep")
    p.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(p, x=x, y=np.stack(ys), content=classes["content"],
                        rare=classes["rare"], cf=np.stack([guesses[y] for y in ys]))
    cf = mean_split(splits)
    diameter = dchi_diameter_bound(bundle.table, bundle.regular_ids)
    vocab = DChiFloor(bundle.table[bundle.regular_ids], tokens=3000, rng=1).unchanged(eta)
    rec = {"kind": "sweep", "candidate": cand.key, "table": cand.table,
           "policy": cand.policy, "p": cand.p, "eta": eta, "bundle_id": bundle.bundle_id,
           "table_dim": bundle.table_dim, "tokens": int(x.size),
           "rare_tokens": classes.sizes()["rare"], "content_tokens": classes.sizes()["content"],
           "vocab_unchanged": vocab, "worst_case_eps": eta * diameter, "diameter": diameter,
           "unchanged": {c: float(np.mean([u[c] for u in unchanged])) for c in unchanged[0]},
           "cf": cf, "posterior_s": t1 - t0, "attack_s": time.time() - t1, "machine": machine(),
           # the first frontier's fields
           "survive": float(np.mean([u["all"] for u in unchanged])),
           "context_free": cf["all"]["exact"], "rare_context_free": cf["rare"]["exact"],
           "context_free_draws": [s["all"]["exact"] for s in splits]}
    return rec


def _pct(x) -> str:
    return "—" if x is None else f"{x:.4f}"


def cmd_sweep(a) -> int:
    out = Path(a.out)
    done = set() if a.refresh else {(r["candidate"], r["eta"]) for r in _records(out)
                                    if r["kind"] == "sweep" and "cf" in r}
    for key in a.tables.split(","):
        cand = Candidate.parse(key)
        etas = [float(x) for x in (a.etas.split(",") if a.etas
                                   else DEFAULT_ETAS.get(cand.table, ()))]
        for eta in etas:
            if (cand.key, eta) in done:
                continue
            rec = sweep_point(out, cand, eta)
            _append(out, rec)
            u, cf = rec["unchanged"], rec["cf"]
            log(f"{cand.key} eta={eta:g}: unchanged all/content/rare {u['all']:.4f}/"
                f"{u['content']:.4f}/{u['rare']:.4f}; context-free exact "
                f"{_pct(cf['all']['exact'])}/{_pct(cf['content']['exact'])}/"
                f"{_pct(cf['rare']['exact'])}, content top-5 {_pct(cf['content']['top5'])}, "
                f"semantic {_pct(cf['content']['semantic'])}; worst case "
                f"{rec['worst_case_eps']:.1f}/token ({rec['posterior_s']:.0f}+"
                f"{rec['attack_s']:.0f} s)")
    return 0


def matched_eta(points: list[tuple[float, float]], target: float) -> float | None:
    """The η whose recovery is ``target``, by linear interpolation in log η between the two
    swept points around it (recovery increases with η); None if it is not bracketed."""
    pts = sorted(points)
    for (e0, r0), (e1, r1) in zip(pts, pts[1:], strict=False):
        if r0 <= target <= r1 and r1 > r0:
            f = (target - r0) / (r1 - r0)
            return float(math.exp(math.log(e0) + f * (math.log(e1) - math.log(e0))))
    return None


# matched privacy (issue 41): the strongest attack's exact recovery of content and of rare
# tokens, and its semantic recovery of content tokens, each at most the reference's
CRITERIA = (("content", "exact"), ("rare", "exact"), ("content", "semantic"))


def strongest(row: dict, cls: str, measure: str) -> float | None:
    """The larger of the context-free and the contextual attack's figure (contextual where
    the denoiser was trained)."""
    vals = [row.get(k, {}).get(cls, {}).get(measure) for k in ("cf", "ctx")]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def matches(out: Path, reference=REFERENCE, attack: str = "context_free"
            ) -> tuple[float | None, dict[str, float | None]]:
    """The reference's recovery by ``attack`` ("context_free", or "strongest": the larger of
    the context-free and the contextual attack, where the denoiser was trained) over all
    tokens and, per candidate, the η with the same recovery (interpolated in log η)."""
    rows = frontier_rows(out)
    key = "context_free" if attack == "context_free" else "strongest"
    ref = [r for r in rows if r["candidate"] == reference[0]
           and abs(r["eta"] - reference[1]) <= 0.003 * reference[1]]
    if not ref or ref[0].get(key) is None or (key == "strongest" and "contextual" not in ref[0]):
        return None, {}
    target = ref[0][key]
    pts: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get(key) is not None and (key == "context_free" or "contextual" in r):
            pts.setdefault(r["candidate"], []).append((r["eta"], r[key]))
    return target, {t: matched_eta(p, target) for t, p in sorted(pts.items())}


def class_matches(out: Path, reference=REFERENCE, contextual: bool = True
                  ) -> tuple[dict | None, dict[str, dict]]:
    """Issue 41's matched privacy: the reference's figure on each of :data:`CRITERIA`
    (strongest attack; ``contextual``: only rows where the denoiser was trained) and, per
    candidate, the η at which each is reached and the smallest of them (the η at which every
    criterion holds)."""
    rows = [r for r in frontier_rows(out) if "cf" in r and (not contextual or "ctx" in r)]
    ref = [r for r in rows if r["candidate"] == reference[0]
           and abs(r["eta"] - reference[1]) <= 0.003 * reference[1]]
    if not ref:
        return None, {}
    target = {f"{c}/{m}": strongest(ref[0], c, m) for c, m in CRITERIA}
    res: dict[str, dict] = {}
    for cand in sorted({r["candidate"] for r in rows}):
        mine = [r for r in rows if r["candidate"] == cand]
        etas = {}
        for c, m in CRITERIA:
            pts = [(r["eta"], v) for r in mine if (v := strongest(r, c, m)) is not None]
            etas[f"{c}/{m}"] = matched_eta(pts, target[f"{c}/{m}"]) if target[f"{c}/{m}"] \
                is not None else None
        known = [e for e in etas.values() if e is not None]
        res[cand] = {"by": etas, "eta": min(known) if len(known) == len(etas) else None}
    return target, res


def cmd_match(a) -> int:
    out = Path(a.out)
    ref_table, ref_eta = a.reference.split(":")
    target, m = matches(out, (ref_table, float(ref_eta)), a.attack)
    if target is None:
        print(f"no sweep point for the reference {a.reference}: run sweep first")
        return 1
    print(f"reference {a.reference}: {a.attack.replace('_', '-')} recovery {target:.4f}")
    for t, eta in m.items():
        print(f"  {t}: matched eta {'not bracketed' if eta is None else f'{eta:.4g}'}")
        if eta is not None and a.check:
            eta_r = round(eta, 2)
            if not any(r["kind"] == "sweep" and r["candidate"] == t and r["eta"] == eta_r
                       for r in _records(out)):
                rec = sweep_point(out, Candidate.parse(t), eta_r)
                _append(out, rec)
                print(f"    checked at {eta_r:g}: context-free {rec['context_free']:.4f} "
                      f"(target {target:.4f}, {rec['context_free'] - target:+.4f}), "
                      f"survive {rec['survive']:.4f}")
    target2, by_class = class_matches(out, (ref_table, float(ref_eta)),
                                      contextual=a.attack == "strongest")
    if target2:
        print("matched by class (" + ", ".join(f"{k} {_pct(v)}" for k, v in target2.items())
              + "):")
        for t, r in by_class.items():
            print(f"  {t}: eta {_fmt(r['eta'], '.4g')} (" + ", ".join(
                f"{k} {_fmt(v, '.4g')}" for k, v in r["by"].items()) + ")")
    return 0


def cmd_train(a) -> int:
    from bench.utility import explore

    out = Path(a.out)
    cand = Candidate(a.table, a.policy, a.p if a.policy != NO_POLICY else None)
    post = posterior_path(out, cand, a.eta)
    if not post.exists():
        load_or_build_posterior(out, bundle_for(cand), cand, a.eta)
    name = f"F-{cand.key}-eta{a.eta:g}-n{a.n}-e{a.epochs}"
    argv = ["--name", name, "--n", str(a.n), "--epochs", str(a.epochs), "--fresh",
            "--eta", str(a.eta), "--table", a.table, "--posterior", str(post),
            "--out", str(out / "train.jsonl"), "--policy", cand.policy]
    if cand.p is not None:
        argv += ["--public-p", str(cand.p)]
    if a.threads:
        argv += ["--threads", str(a.threads)]
    rec = explore.run(explore.parse_args(argv))
    _append(out, {"kind": "train", "candidate": cand.key, "table": a.table, "eta": a.eta,
                  "n": a.n, "epochs": a.epochs, **{k: rec[k] for k in (
                      "name", "sent_mean", "sent_draws", "phrase2000", "train_s",
                      "total_s", "best_epoch", "machine", "load")}})
    return 0


def contextual_guesses(denoiser, bundle, seqs, ys: list[np.ndarray], k: int = TOP,
                       batch_size: int = 128) -> np.ndarray:
    """(N, k) the denoiser's k most probable originals of every token of ``ys`` (one
    privatization of ``seqs``), in order."""
    import torch

    from models.attacks.denoiser_train import _batches, collate

    lengths = np.array([len(q) for q in seqs])
    n = denoiser.candidates.numel()
    out: list = [None] * len(seqs)
    with torch.no_grad():
        for idx in _batches(lengths, batch_size, None):
            b = collate([ys[i] for i in idx], None, bundle.special_ids)
            top = denoiser.logits(b["input_ids"], b["attention_mask"]).topk(k, -1).indices
            ids = torch.where(top == n, b["input_ids"].unsqueeze(-1),
                              denoiser.candidates[top.clamp(max=n - 1)]).numpy()
            for j, i in enumerate(idx):
                out[i] = ids[j, 1:len(ys[i]) + 1]
    return np.concatenate(out)


def cmd_denoise(a) -> int:
    from bench.utility.denoiser import TRAIN
    from models.attacks.denoiser_train import (
        DenoiserConfig,
        privatize_sequences,
        public_denoiser,
        read_corpus,
    )
    from models.training.data import read_labelled_tsv
    from shared.mechanisms import DChiText
    from shared.recovery import unchanged_by_class

    out = Path(a.out)
    cand = Candidate(a.table, a.policy, a.p if a.policy != NO_POLICY else None)
    bundle = bundle_for(cand)
    post = load_or_build_posterior(out, bundle, cand, a.eta)
    texts = read_labelled_tsv(TRAIN, a.texts or None).texts + (
        read_corpus(a.corpus) if a.corpus else [])
    cfg = DenoiserConfig(layers=2, candidates=4096, epochs=a.epochs, seed=0, progress=False)
    t0 = time.perf_counter()
    d = public_denoiser(bundle, post, texts, cfg, rng=np.random.default_rng([0, 11]),
                        cache=out / "denoisers" / f"{cand.key}-{a.eta:g}")
    t1 = time.perf_counter()
    seqs, classes, near = dev_tokens(bundle, post)
    x = np.concatenate(seqs)
    mech = DChiText(bundle, a.eta, public_p=cand.params(a.eta).get("public_p"))
    rng = np.random.default_rng([0, 31])
    splits, guesses, ys, unchanged = [], [], [], []
    for _ in range(DRAWS):
        y_seqs = privatize_sequences(mech, seqs, rng)
        y = np.concatenate(y_seqs)
        g = contextual_guesses(d, bundle, seqs, y_seqs)
        ys.append(y)
        guesses.append(g)
        splits.append(split(x, g, classes, near))
        unchanged.append(unchanged_by_class(x, y, classes))
    p = tokens_path(out, cand, a.eta, "denoise")
    p.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(p, x=x, y=np.stack(ys), ctx=np.stack(guesses))
    ctx = mean_split(splits)
    _append(out, {"kind": "denoise", "candidate": cand.key, "table": a.table, "eta": a.eta,
                  "texts_limit": a.texts, "ctx": ctx, "contextual": ctx["all"]["exact"],
                  "contextual_draws": [s["all"]["exact"] for s in splits],
                  "unchanged": {c: float(np.mean([u[c] for u in unchanged]))
                                for c in unchanged[0]},
                  "denoiser_s": t1 - t0, "texts": len(texts), "epochs": a.epochs,
                  "machine": machine()})
    log(f"{cand.key} eta={a.eta:g}: contextual exact all/content/rare "
        f"{_pct(ctx['all']['exact'])}/{_pct(ctx['content']['exact'])}/"
        f"{_pct(ctx['rare']['exact'])}, content top-5 {_pct(ctx['content']['top5'])}, "
        f"semantic {_pct(ctx['content']['semantic'])} ({t1 - t0:.0f} s to train)")
    return 0


def cmd_neighbours(a) -> int:
    """The split of the mechanism's outputs (Asghar et al. 2024, arXiv 2411.13784): the
    original itself, a token among the original's 100 nearest in the privatization table, or
    one farther away -- by token class, from a sweep point's kept draws."""
    from bench.utility.denoiser import neighbour_ranks

    out = Path(a.out)
    cand = Candidate(a.table, a.policy, a.p if a.policy != NO_POLICY else None)
    p = tokens_path(out, cand, a.eta, "sweep")
    if not p.exists():
        print(f"no sweep point kept for {cand.key} at eta {a.eta:g}: run sweep first")
        return 1
    z = np.load(p)
    x, y = z["x"], z["y"][0]
    bundle = bundle_for(cand)
    res: dict[str, dict] = {}
    for cls, mask in (("all", np.ones(x.size, dtype=bool)), ("content", z["content"]),
                      ("rare", z["rare"])):
        xs, ys = x[mask], y[mask]
        same = ys == xs
        ranks = neighbour_ranks(bundle, ys[~same], xs[~same])  # y among the neighbours of x
        near = ranks < a.k
        n = xs.size
        res[cls] = {"tokens": int(n), "original": float(same.mean()),
                    f"within_{a.k}": float(near.sum() / n), "farther": float((~near).sum() / n)}
    rec = {"kind": "neighbours", "candidate": cand.key, "table": cand.table, "eta": a.eta,
           "k": a.k, "split": res}
    _append(out, rec)
    for cls, r in res.items():
        print(f"{cand.key} eta={a.eta:g} {cls} ({r['tokens']:,} tokens): original "
              f"{r['original']:.4f}, within the {a.k} nearest {r[f'within_{a.k}']:.4f}, "
              f"farther {r['farther']:.4f}")
    return 0


def frontier_rows(out: Path) -> list[dict]:
    """One row per (candidate, η) with what was measured there (the latest of each kind)."""
    rows: dict[tuple, dict] = {}
    recs = _records(out)
    # one point per candidate and η; an η within 0.3% of another (a matched η interpolated
    # twice) is the same point, shown at the first η measured there
    points: dict[str, list[float]] = {}
    for r in recs:
        etas = points.setdefault(r["candidate"], [])
        eta = float(r["eta"])
        if not any(abs(eta - e) <= 0.003 * e for e in etas):
            etas.append(eta)
    for r in recs:
        eta = float(r["eta"])
        first = next(e for e in points[r["candidate"]] if abs(eta - e) <= 0.003 * e)
        key = (r["candidate"], first)
        row = rows.setdefault(key, {"candidate": r["candidate"], "table": r["table"],
                                    "eta": first, "etas": set()})
        row["etas"].add(eta)
        if r["kind"] == "sweep":
            row.update(survive=r["survive"], context_free=r["context_free"],
                       worst_case_eps=r["worst_case_eps"], table_dim=r["table_dim"],
                       rare_context_free=r.get("rare_context_free"),
                       vocab_unchanged=r.get("vocab_unchanged"))
            if "cf" in r:
                row.update(cf=r["cf"], unchanged=r["unchanged"])
        elif r["kind"] == "train":
            row.update(sent_mean=r["sent_mean"], sent_draws=r["sent_draws"],
                       phrase2000=r["phrase2000"], n=r["n"], train_s=r["train_s"])
        elif r["kind"] == "denoise":
            row.update(contextual=r["contextual"])
            if "ctx" in r:
                row.update(ctx=r["ctx"])
    for row in rows.values():
        attacks = [row.get("context_free"), row.get("contextual")]
        row["strongest"] = max((x for x in attacks if x is not None), default=None)
    return sorted(rows.values(), key=lambda r: (r["candidate"], r["eta"]))


def _fmt(x, spec=".4f") -> str:
    return "—" if x is None else format(x, spec)


def cmd_report(a) -> int:
    from bench.common import table as md_table

    out = Path(a.out)
    rows = frontier_rows(out)
    if not rows:
        print("nothing measured yet")
        return 1
    print(md_table(["candidate", "η", "survive", "context-free attack", "contextual attack",
                    "strongest", "context-free, rare tokens", "vocabulary unchanged",
                    "worst-case ε/token", "accuracy (3 draws)", "draws", "phrase level"],
                   [[r["candidate"], "/".join(f"{e:g}" for e in sorted(r["etas"])),
                     _fmt(r.get("survive")),
                     _fmt(r.get("context_free")), _fmt(r.get("contextual")),
                     _fmt(r.get("strongest")), _fmt(r.get("rare_context_free")),
                     _fmt(r.get("vocab_unchanged")), _fmt(r.get("worst_case_eps"), ".1f"),
                     _fmt(r.get("sent_mean")),
                     " ".join(f"{x:.3f}" for x in r.get("sent_draws", [])) or "—",
                     _fmt(r.get("phrase2000"))] for r in rows]))
    split_rows = [r for r in rows if "cf" in r]
    if split_rows:
        print("\nby token class (content: not a public word of the standard stop list; rare: "
              f"outside the {RARE_FROM:,} most frequent training tokens); strongest attack = "
              "the larger of the context-free and the contextual one")
        heads = ["candidate", "η", "unchanged all/content/rare"]
        for c, m in (("all", "exact"), ("content", "exact"), ("rare", "exact"),
                     ("content", "top5"), ("content", "semantic")):
            heads.append(f"strongest {c} {m}")
        heads += ["attacks", "accuracy"]
        print(md_table(heads, [[r["candidate"], f"{r['eta']:g}",
                                "/".join(_fmt(r["unchanged"].get(c)) for c in
                                         ("all", "content", "rare")),
                                *[_fmt(strongest(r, c, m)) for c, m in (
                                    ("all", "exact"), ("content", "exact"), ("rare", "exact"),
                                    ("content", "top5"), ("content", "semantic"))],
                                "cf+ctx" if "ctx" in r else "cf", _fmt(r.get("sent_mean"))]
                               for r in split_rows]))
    for attack, what in (("context_free", "the context-free Bayes attack"),
                         ("strongest", "the strongest attack (context-free or contextual)")):
        target, m = matches(out, attack=attack)
        if target is None:
            continue
        print(f"\nmatched privacy by {what} over all tokens: recovery {target:.4f} (the "
              "384-d table at eta 65)")
        for t, eta in m.items():
            if t == REFERENCE[0]:
                continue
            print(f"  {t}: eta {_fmt(eta, '.4g')}, accuracy "
                  f"{_accuracy_near(rows, t, eta)}")
    for contextual in (False, True):
        target, by_class = class_matches(out, contextual=contextual)
        if not target:
            continue
        what = ("strongest attack, rows where the denoiser was trained" if contextual else
                "every row: the strongest attack measured there, context-free only where no "
                "denoiser was trained")
        print(f"\nmatched privacy by class ({what}): the reference's " + ", ".join(
            f"{k} {_pct(v)}" for k, v in target.items()))
        for t, r in by_class.items():
            if t == REFERENCE[0]:
                continue
            print(f"  {t}: eta {_fmt(r['eta'], '.4g')} (" + ", ".join(
                f"{k} at {_fmt(v, '.4g')}" for k, v in r["by"].items()) + "), accuracy "
                f"{_accuracy_near(rows, t, r['eta'])}")
    if a.png:
        plot(rows, Path(a.png))
        print(f"\nwrote {a.png}")
    return 0


def _accuracy_near(rows: list[dict], cand: str, eta: float | None) -> str:
    near = [r for r in rows if r["candidate"] == cand and eta is not None
            and abs(r["eta"] - eta) <= 0.02 * eta and "sent_mean" in r]
    return _fmt(near[0]["sent_mean"] if near else None) + measured_at(near)


def measured_at(near: list[dict]) -> str:
    return (" (measured at eta " + "/".join(f"{e:g}" for e in sorted(near[0]["etas"])) + ")") if near else ""


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (what, get) in zip(axes, (
            ("all tokens", lambda r: r.get("strongest")),
            ("content tokens", lambda r: strongest(r, "content", "exact"))), strict=True):
        for t in sorted({r["candidate"] for r in rows}):
            pts = sorted((x, r["sent_mean"]) for r in rows
                         if r["candidate"] == t and (x := get(r)) is not None
                         and r.get("sent_mean") is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t)
        ref = [x for r in rows if r["candidate"] == REFERENCE[0]
               and abs(r["eta"] - REFERENCE[1]) <= 0.003 * REFERENCE[1] and (x := get(r)) is not None]
        if ref:  # matched privacy: at or left of this line
            ax.axvline(ref[0], ls="--", color="gray",
                       label=f"{REFERENCE[0]} table at eta {REFERENCE[1]:g} (reference)")
        ax.set_xlabel(f"{what} recovered by the strongest attack (share)")
        ax.set_ylabel("accuracy, whole sentences (mean of 3 draws)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("privbert: privacy–utility frontier (tables, token policies)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.utility frontier",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("sweep", "match", "train", "denoise", "neighbours", "report"):
        p = sub.add_parser(name)
        p.add_argument("--out", default="out/frontier")
    s = sub.choices
    s["sweep"].add_argument("--tables", default=",".join(DEFAULT_TABLES),
                            help="candidates: TABLE or TABLE+POLICY@P (e.g. "
                                 "pca32-int8+function-words@0.3)")
    s["sweep"].add_argument("--etas", help="comma-separated η (default: a grid per table)")
    s["sweep"].add_argument("--refresh", action="store_true",
                            help="measure again points already measured (channel tables are "
                                 "kept and reused)")
    s["match"].add_argument("--reference", default="none:65")
    s["match"].add_argument("--attack", choices=("context_free", "strongest"),
                            default="context_free")
    s["match"].add_argument("--check", action="store_true",
                            help="sweep each matched η to check it")
    s["neighbours"].add_argument("--k", type=int, default=100)
    for name in ("train", "denoise", "neighbours"):
        s[name].add_argument("--table", required=True)
        s[name].add_argument("--eta", type=float, required=True)
        s[name].add_argument("--policy", default=NO_POLICY,
                             help="the token policy (shared.policy.POLICIES) or none")
        s[name].add_argument("--p", type=float, default=DEFAULT_P,
                             help="under a policy: the probability that a public word is "
                                  "privatized")
    s["train"].add_argument("--n", type=int, default=10000)
    s["train"].add_argument("--epochs", type=int, default=3)
    s["train"].add_argument("--threads", type=int, default=0)
    s["denoise"].add_argument("--epochs", type=int, default=1)
    s["denoise"].add_argument("--corpus", default="",
                              help="more public text (e.g. ../shared/data/corpus/agnews.txt)")
    s["denoise"].add_argument("--texts", type=int, default=20000,
                              help="training sentences the denoiser reads (0 = all)")
    s["report"].add_argument("--png")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return {"sweep": cmd_sweep, "match": cmd_match, "train": cmd_train,
            "denoise": cmd_denoise, "neighbours": cmd_neighbours,
            "report": cmd_report}[a.cmd](a)
