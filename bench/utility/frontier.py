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
* ``denoise``: the contextual denoiser (``models.denoiser``) retrained for that table and η
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
from pathlib import Path

import numpy as np

from bench.common import DATA, machine
from bench.utility.cache import log

DEFAULT_TABLES = ("none", "pca64-int8", "pca32-int8", "pca16-int8")
REFERENCE = ("none", 65.0)
DEFAULT_ETAS = {"none": (55.0, 60.0, 65.0, 70.0), "pca64-int8": (35.0, 42.0, 50.0),
                "pca32-int8": (25.0, 32.0, 40.0, 48.0), "pca16-int8": (12.0, 16.0, 20.0, 26.0)}


def bundle_for(table: str):
    from shared.bundle import EdgeBundle

    return EdgeBundle.from_model(table=None if table == "none" else table)


def _append(out: Path, rec: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _records(out: Path) -> list[dict]:
    p = out / "results.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def posterior_path(out: Path, table: str, eta: float) -> Path:
    return out / f"post-{table}-{eta:.4g}.npz"


def load_or_build_posterior(out: Path, bundle, table: str, eta: float):
    from models.data import read_labelled_tsv
    from models.posterior import ChannelPosterior, build_posterior

    p = posterior_path(out, table, eta)
    if p.exists():
        return ChannelPosterior.load(p)
    whole = read_labelled_tsv(DATA / "sst2_sentences" / "train.tsv")
    post = build_posterior(bundle, "dchi-text", eta, whole.texts, passes=1.0, min_draws=16,
                           rng=np.random.default_rng(7))
    p.parent.mkdir(parents=True, exist_ok=True)
    post.save(p)
    return post


RARE_FROM = 4096  # a "rare" token: not among this many most frequent of the training text


def sweep_point(out: Path, bundle, table: str, eta: float, draws: int = 3) -> dict:
    """Survival, context-free recovery (all dev tokens, and the rare ones) and the
    worst-case ε of one (table, η); the share of the whole vocabulary left unchanged
    (uniform over the regular tokens: the floor's quantity, ``shared.floor.DChiFloor``)."""
    from models.data import read_labelled_tsv
    from models.denoiser_train import privatize_sequences, token_sequences
    from shared.accounting import dchi_diameter_bound
    from shared.floor import DChiFloor
    from shared.mechanisms import DChiText

    t0 = time.time()
    post = load_or_build_posterior(out, bundle, table, eta)
    t1 = time.time()
    dev = read_labelled_tsv(DATA / "sst2_sentences" / "dev.tsv")
    seqs = token_sequences(bundle, dev.texts, 128)
    x = np.concatenate(seqs)
    order = np.argsort(-post.prior_counts, kind="stable")
    rare = np.ones(bundle.vocab_size, dtype=bool)
    rare[order[:RARE_FROM]] = False
    rare_x = rare[x]
    mech, map_ids = DChiText(bundle, eta), post.map_ids()
    rng = np.random.default_rng([31, 7])  # the draws models.denoiser_train.recovery makes
    res: dict[str, list[float]] = {"survive": [], "context_free": [], "rare_survive": [],
                                   "rare_context_free": []}
    for _ in range(draws):
        y = np.concatenate(privatize_sequences(mech, seqs, rng))
        hit = map_ids[y] == x
        res["survive"].append(float((y == x).mean()))
        res["context_free"].append(float(hit.mean()))
        res["rare_survive"].append(float((y == x)[rare_x].mean()))
        res["rare_context_free"].append(float(hit[rare_x].mean()))
    diameter = dchi_diameter_bound(bundle.table, bundle.regular_ids)
    vocab = DChiFloor(bundle.table[bundle.regular_ids], tokens=3000, rng=1).unchanged(eta)
    rec = {"kind": "sweep", "table": table, "eta": eta, "bundle_id": bundle.bundle_id,
           "table_dim": bundle.table_dim, "tokens": int(x.size),
           "rare_tokens": int(rare_x.sum()), "vocab_unchanged": vocab,
           "worst_case_eps": eta * diameter, "diameter": diameter,
           "posterior_s": t1 - t0, "attack_s": time.time() - t1, "machine": machine()}
    for k, v in res.items():
        rec[k], rec[f"{k}_draws"] = float(np.mean(v)), v
    return rec


def cmd_sweep(a) -> int:
    out = Path(a.out)
    done = set() if a.refresh else {(r["table"], r["eta"]) for r in _records(out)
                                    if r["kind"] == "sweep"}
    for table in a.tables.split(","):
        bundle = bundle_for(table)
        etas = [float(x) for x in (a.etas.split(",") if a.etas else DEFAULT_ETAS.get(table, ()))]
        for eta in etas:
            if (table, eta) in done:
                continue
            rec = sweep_point(out, bundle, table, eta)
            _append(out, rec)
            log(f"{table} eta={eta:g}: survive {rec['survive']:.4f}, context-free "
                f"{rec['context_free']:.4f} (rare tokens {rec['rare_context_free']:.4f}), "
                f"vocabulary unchanged {rec['vocab_unchanged']:.4f}, worst case "
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


def matches(out: Path, reference=REFERENCE, attack: str = "context_free"
            ) -> tuple[float | None, dict[str, float | None]]:
    """The reference's recovery by ``attack`` ("context_free", or "strongest": the larger of
    the context-free and the contextual attack, where the denoiser was trained) and, per
    table, the η with the same recovery (interpolated in log η)."""
    rows = frontier_rows(out)
    key = "context_free" if attack == "context_free" else "strongest"
    ref = [r for r in rows if r["table"] == reference[0]
           and abs(r["eta"] - reference[1]) <= 0.003 * reference[1]]
    if not ref or ref[0].get(key) is None or (key == "strongest" and "contextual" not in ref[0]):
        return None, {}
    target = ref[0][key]
    pts: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get(key) is not None and (key == "context_free" or "contextual" in r):
            pts.setdefault(r["table"], []).append((r["eta"], r[key]))
    return target, {t: matched_eta(p, target) for t, p in sorted(pts.items())}


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
            if not any(r["kind"] == "sweep" and r["table"] == t and r["eta"] == eta_r
                       for r in _records(out)):
                rec = sweep_point(out, bundle_for(t), t, eta_r)
                _append(out, rec)
                print(f"    checked at {eta_r:g}: context-free {rec['context_free']:.4f} "
                      f"(target {target:.4f}, {rec['context_free'] - target:+.4f}), "
                      f"survive {rec['survive']:.4f}")
    return 0


def cmd_train(a) -> int:
    from bench.utility import explore

    out = Path(a.out)
    post = posterior_path(out, a.table, a.eta)
    if not post.exists():
        load_or_build_posterior(out, bundle_for(a.table), a.table, a.eta)
    name = f"F-{a.table}-eta{a.eta:g}-n{a.n}-e{a.epochs}"
    argv = ["--name", name, "--n", str(a.n), "--epochs", str(a.epochs), "--fresh",
            "--eta", str(a.eta), "--table", a.table, "--posterior", str(post),
            "--out", str(out / "train.jsonl")]
    if a.threads:
        argv += ["--threads", str(a.threads)]
    rec = explore.run(explore.parse_args(argv))
    _append(out, {"kind": "train", "table": a.table, "eta": a.eta, "n": a.n,
                  "epochs": a.epochs, **{k: rec[k] for k in (
                      "name", "sent_mean", "sent_draws", "phrase2000", "train_s",
                      "total_s", "best_epoch", "machine", "load")}})
    return 0


def cmd_denoise(a) -> int:
    from bench.utility.denoiser import train_for_frontier

    out = Path(a.out)
    bundle = bundle_for(a.table)
    post = load_or_build_posterior(out, bundle, a.table, a.eta)
    rec = train_for_frontier(bundle, post, out / "denoisers" / f"{a.table}-{a.eta:g}",
                             epochs=a.epochs, corpus=a.corpus or None,
                             texts_limit=a.texts)
    _append(out, {"kind": "denoise", "table": a.table, "eta": a.eta, "texts_limit": a.texts,
                  **rec})
    log(f"{a.table} eta={a.eta:g}: contextual {rec['contextual']:.4f}, context-free "
        f"{rec.get('context_free', float('nan')):.4f}, survive {rec['survive']:.4f}")
    return 0


def frontier_rows(out: Path) -> list[dict]:
    """One row per (table, η) with what was measured there (the latest of each kind)."""
    rows: dict[tuple, dict] = {}
    recs = _records(out)
    # one point per table and η; an η within 0.3% of another (a matched η interpolated twice)
    # is the same point, shown at the first η measured there
    points: dict[str, list[float]] = {}
    for r in recs:
        etas = points.setdefault(r["table"], [])
        eta = float(r["eta"])
        if not any(abs(eta - e) <= 0.003 * e for e in etas):
            etas.append(eta)
    for r in recs:
        eta = float(r["eta"])
        first = next(e for e in points[r["table"]] if abs(eta - e) <= 0.003 * e)
        key = (r["table"], first)
        row = rows.setdefault(key, {"table": r["table"], "eta": first, "etas": set()})
        row["etas"].add(eta)
        if r["kind"] == "sweep":
            row.update(survive=r["survive"], context_free=r["context_free"],
                       worst_case_eps=r["worst_case_eps"], table_dim=r["table_dim"],
                       rare_context_free=r.get("rare_context_free"),
                       vocab_unchanged=r.get("vocab_unchanged"))
        elif r["kind"] == "train":
            row.update(sent_mean=r["sent_mean"], sent_draws=r["sent_draws"],
                       phrase2000=r["phrase2000"], n=r["n"], train_s=r["train_s"])
        elif r["kind"] == "denoise":
            row.update(contextual=r["contextual"])
    for row in rows.values():
        attacks = [row.get("context_free"), row.get("contextual")]
        row["strongest"] = max((x for x in attacks if x is not None), default=None)
    return sorted(rows.values(), key=lambda r: (r["table"], r["eta"]))


def _fmt(x, spec=".4f") -> str:
    return "—" if x is None else format(x, spec)


def cmd_report(a) -> int:
    from bench.common import table as md_table

    out = Path(a.out)
    rows = frontier_rows(out)
    if not rows:
        print("nothing measured yet")
        return 1
    print(md_table(["table", "η", "survive", "context-free attack", "contextual attack",
                    "strongest", "context-free, rare tokens", "vocabulary unchanged",
                    "worst-case ε/token", "accuracy (3 draws)", "draws", "phrase level"],
                   [[r["table"], "/".join(f"{e:g}" for e in sorted(r["etas"])),
                     _fmt(r.get("survive")),
                     _fmt(r.get("context_free")), _fmt(r.get("contextual")),
                     _fmt(r.get("strongest")), _fmt(r.get("rare_context_free")),
                     _fmt(r.get("vocab_unchanged")), _fmt(r.get("worst_case_eps"), ".1f"),
                     _fmt(r.get("sent_mean")),
                     " ".join(f"{x:.3f}" for x in r.get("sent_draws", [])) or "—",
                     _fmt(r.get("phrase2000"))] for r in rows]))
    for attack, what in (("context_free", "the context-free Bayes attack"),
                         ("strongest", "the strongest attack (context-free or contextual)")):
        target, m = matches(out, attack=attack)
        if target is None:
            continue
        print(f"\nmatched privacy by {what}: recovery {target:.4f} (the 384-d table at eta 65)")
        for t, eta in m.items():
            if t == REFERENCE[0]:
                continue
            near = [r for r in rows if r["table"] == t and eta is not None
                    and abs(r["eta"] - eta) <= 0.02 * eta and "sent_mean" in r]
            acc = near[0]["sent_mean"] if near else None
            print(f"  {t}: eta {_fmt(eta, '.4g')}, accuracy "
                  f"{_fmt(acc)}{measured_at(near)}")
    if a.png:
        plot(rows, Path(a.png))
        print(f"\nwrote {a.png}")
    return 0


def measured_at(near: list[dict]) -> str:
    return (" (measured at eta " + "/".join(f"{e:g}" for e in sorted(near[0]["etas"])) + ")") if near else ""


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for t in sorted({r["table"] for r in rows}):
        pts = sorted((r["strongest"], r["sent_mean"]) for r in rows
                     if r["table"] == t and r.get("strongest") is not None
                     and r.get("sent_mean") is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t)
    ax.set_xlabel("tokens recovered by the strongest attack (share)")
    ax.set_ylabel("accuracy, whole sentences (mean of 3 draws)")
    ax.set_title("privbert: privacy–utility frontier of the privatization table")
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.utility frontier",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("sweep", "match", "train", "denoise", "report"):
        p = sub.add_parser(name)
        p.add_argument("--out", default="out/frontier")
    s = sub.choices
    s["sweep"].add_argument("--tables", default=",".join(DEFAULT_TABLES))
    s["sweep"].add_argument("--etas", help="comma-separated η (default: a grid per table)")
    s["sweep"].add_argument("--refresh", action="store_true",
                            help="measure again points already measured (channel tables are "
                                 "kept and reused)")
    s["match"].add_argument("--reference", default="none:65")
    s["match"].add_argument("--attack", choices=("context_free", "strongest"),
                            default="context_free")
    s["match"].add_argument("--check", action="store_true",
                            help="sweep each matched η to check it")
    for name in ("train", "denoise"):
        s[name].add_argument("--table", required=True)
        s[name].add_argument("--eta", type=float, required=True)
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
            "denoise": cmd_denoise, "report": cmd_report}[a.cmd](a)
