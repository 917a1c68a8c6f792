"""Qu et al. 2021 Tables 4–7 in small: SST-2 dev accuracy of MiniLM under each privatization.

    python -m bench.utility table [--train 6000] [--dev 2000] [--epochs 2] [--lr 2e-5]
                                  [--pretrain-steps 400] [--pretrain-batch 32] [--seed 0]
                                  [--only ROW[,ROW]] [--out out/utility] [--table-only]

Rows (ids for ``--only``; shell-style patterns such as ``text-*`` work):

- ``null``: Null privacy (plain token ids, mechanism ``none``);
- ``text-P`` / ``emb-P``: ``dchi-text`` / ``dchi-embedding`` at the η whose token embedding
  inversion accuracy on SST-2 dev tokens is P (0.1084, 0.3402, 0.6354, 0.85 — Qu et al.
  Table 3 at η = 75, 100, 125, 150 for BERT-base), calibrated first on one fixed noise draw
  (``edge_agent.report.FixedDraw`` / ``target_eta``), the same η for both mechanisms;
- ``text-P-denoising`` / ``emb-P-denoising``: fine-tuned from a Denoising MLM pretraining with
  the same mechanism and η (``models.pretraining.pretrain``, §3.4), ``-vanilla`` / ``-prob`` at 0.3402;
- ``laplace``: DPNR (Lyu et al. 2020) ε = 1, per-coordinate calibration as published, word
  dropout μ = 0.1; ``ome``: OME (Lyu et al. 2020) ε = 1, λ = 100; both on the frozen MiniLM
  mean-pooled sentence encoder (``models.export.writers.export_bundle``), with the worst-case ε of
  ``shared.accounting`` beside the published one.

Every row privatizes a seeded subset of ``../shared/data/sst2/train.tsv`` and the dev set
with the edge's ``Privatizer`` (``models.training.experiment.train_from_tsv``) and fine-tunes; the dev
accuracy is that of the best epoch (the library keeps it) and the last epoch's is shown too.
Both are measured on the one noise draw the epoch was chosen on, which flatters them: the
kept model is also evaluated on all dev rows privatized afresh, and the targets are judged on
that figure.
Results, calibration and pretrained checkpoints are cached under ``--out`` keyed by their full
configuration: a re-run skips what is done, ``--table-only`` prints the table from what exists.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fnmatch
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.common import DATA, machine, read_tsv, table
from bench.utility.cache import file_sha, fmt_s, key_of, log, read_json, subset, write_json

POINTS = (0.1084, 0.3402, 0.6354, 0.85)  # Qu et al. Table 3 (SST): eta = 75, 100, 125, 150
PAPER_ETA = {0.1084: 75, 0.3402: 100, 0.6354: 125, 0.85: 150}
PAPER_NULL = 0.9289  # Qu et al. Table 4 header, BERT-base
# Qu et al. Table 6 (token representation) and Table 7 (text-to-text), SST, BERT-base;
# the "orig" columns equal Table 4 columns 1 and 2.
PAPER = {
    ("dchi-embedding", "orig"): {75: 0.5310, 100: 0.5298, 125: 0.5608, 150: 0.5665},
    ("dchi-embedding", "vanilla"): {75: 0.5791, 100: 0.6709, 125: 0.7706, 150: 0.8188},
    ("dchi-embedding", "prob"): {75: 0.5757, 100: 0.6766, 125: 0.7718, 150: 0.8188},
    ("dchi-embedding", "denoising"): {75: 0.6089, 100: 0.7041, 125: 0.7810, 150: 0.8395},
    ("dchi-text", "orig"): {75: 0.5906, 100: 0.7030, 125: 0.8360, 150: 0.8968},
    ("dchi-text", "vanilla"): {75: 0.5963, 100: 0.7190, 125: 0.8429, 150: 0.9048},
    ("dchi-text", "prob"): {75: 0.5734, 100: 0.7259, 125: 0.8429, 150: 0.9071},
    ("dchi-text", "denoising"): {75: 0.5906, 100: 0.7225, 125: 0.8406, 150: 0.9025},
}
OBJECTIVE_NAMES = {"orig": "original weights", "vanilla": "Vanilla MLM", "prob": "Prob MLM",
                   "denoising": "Denoising MLM"}
LAPLACE = {"epsilon": 1.0, "calibration": "coordinate", "word_dropout": 0.1}  # DPNR setting
OME_PARAMS = {"epsilon": 1.0, "lam": 100.0}  # OME paper setting
FRESH_STREAM = 5  # rng stream of the fresh dev privatization (train/dev subsets: 1, 2; noise: 3)
# the utility targets this bench checks, one line each: (row, minimum accuracy)
TARGETS = (("null", 0.90), ("text-0.3402-denoising", 0.74), ("text-0.85-denoising", 0.90))


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    id: str
    mechanism: str
    point: float | None = None       # target inversion accuracy (dχ rows)
    objective: str = "orig"          # pretraining objective, "orig" = the original weights
    params: tuple = ()               # fixed mechanism parameters (laplace, ome)

    @property
    def paper(self) -> float | None:
        if self.mechanism == "none":
            return PAPER_NULL
        if self.point is None:
            return None
        return PAPER[(self.mechanism, self.objective)][PAPER_ETA[self.point]]


def all_rows() -> list[Row]:
    """Every row, in the order they are run (most important first)."""
    short = {"dchi-text": "text", "dchi-embedding": "emb"}

    def dchi(mech: str, p: float, obj: str = "orig") -> Row:
        rid = f"{short[mech]}-{p:g}" + ("" if obj == "orig" else f"-{obj}")
        return Row(rid, mech, p, obj)

    rows = [Row("null", "none")]
    rows += [dchi("dchi-text", p) for p in POINTS]
    rows += [dchi("dchi-embedding", p) for p in POINTS]
    for mech in ("dchi-text", "dchi-embedding"):  # the targets' points first
        rows += [dchi(mech, p, "denoising") for p in (0.3402, 0.85, 0.1084, 0.6354)]
    rows += [dchi(m, 0.3402, o) for m in ("dchi-text", "dchi-embedding")
             for o in ("vanilla", "prob")]
    rows += [Row("laplace", "laplace", params=tuple(LAPLACE.items())),
             Row("ome", "ome", params=tuple(OME_PARAMS.items()))]
    return rows


def display_order(rows: list[Row]) -> list[Row]:
    """Null; per mechanism and point: original, Vanilla, Prob, Denoising; laplace; ome."""
    mech_rank = {"none": 0, "dchi-text": 1, "dchi-embedding": 2, "laplace": 3, "ome": 4}
    obj_rank = {"orig": 0, "vanilla": 1, "prob": 2, "denoising": 3}
    return sorted(rows, key=lambda r: (mech_rank[r.mechanism], r.point or 0,
                                       obj_rank[r.objective]))


# -- calibration -------------------------------------------------------------------------------
def calibrate(out: Path, bundle, dev_tsv: Path, tokens: int, seed: int, tol: float,
              run: bool) -> dict | None:
    """η for each inversion point on one fixed noise draw over ``tokens`` regular word
    pieces of the dev sentences (Qu et al. §5.4; the edge report's code). Cached."""
    cfg = {"bundle_id": bundle.bundle_id, "dev_sha": file_sha(dev_tsv), "tokens": tokens,
           "seed": seed, "tol": tol, "points": list(POINTS)}
    path = out / "calibration" / f"{key_of(cfg)}.json"
    cached = read_json(path)
    if cached is not None or not run:
        return cached
    from edge_agent.report import FixedDraw, target_eta, text_token_sample
    from shared.mechanisms import DChiText

    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, 4])
    texts = [r[0] for r in read_tsv(dev_tsv)]
    ids, _ = text_token_sample(bundle, texts, tokens, rng)
    draw = FixedDraw(DChiText(bundle, 1.0, chunk=1024), ids, rng)
    result = {"config": cfg, "n_tokens": int(ids.size), "points": {}}
    for p in POINTS:
        eta, acc = target_eta(draw, p, tol=tol)
        result["points"][str(p)] = {"eta": eta, "accuracy": acc,
                                    "standard_error": draw.standard_error(acc)}
        log(f"calibration: inversion {p:g} -> eta = {eta:.3f}, measured {acc:.4f} "
            f"(± {1.96 * draw.standard_error(acc):.4f}) on {ids.size} dev tokens")
    result["seconds"] = round(time.perf_counter() - t0, 1)
    write_json(path, result)
    return result


# -- pretraining -------------------------------------------------------------------------------
def pretrain_dir(out: Path, row: Row, eta: float, args, bundle) -> tuple[Path, dict]:
    cfg = {"objective": row.objective, "mechanism": row.mechanism, "eta": eta,
           "steps": args.pretrain_steps, "batch": args.pretrain_batch, "lr": args.pretrain_lr,
           "head_warmup": args.pretrain_head_warmup, "seed": args.seed,
           "bundle_id": bundle.bundle_id, "corpus": "default (agnews + sst2 train sentences)"}
    short = "text" if row.mechanism == "dchi-text" else "emb"
    return out / "pretrain" / f"{row.objective}-{short}-{row.point:g}-{key_of(cfg)}", cfg


def ensure_pretrained(path: Path, cfg: dict, bundle) -> dict:
    """Run (or resume, or reuse) the pretraining; returns its bookkeeping."""
    from models.pretraining.pretrain import INFO_FILE, list_checkpoints, pretrain

    book_path = path / "utility.json"
    book = read_json(book_path) or {"config": cfg, "wall_s": 0.0}
    if (path / INFO_FILE).is_file():
        return book
    resume = bool(list_checkpoints(path))
    if path.exists() and not resume:
        shutil.rmtree(path)  # an attempt that died before its first checkpoint
    log(f"pretrain {path.name}: {cfg['objective']} MLM, {cfg['mechanism']} eta={cfg['eta']:.3f}, "
        f"{cfg['steps']} steps x {cfg['batch']}" + (" (resuming)" if resume else ""))
    t0 = time.perf_counter()
    try:
        pretrain(None, path, cfg["objective"], cfg["mechanism"], cfg["eta"],
                 steps=cfg["steps"], batch_size=cfg["batch"], bundle=bundle, resume=resume,
                 lr=cfg["lr"], head_warmup_steps=cfg["head_warmup"], seed=cfg["seed"],
                 save_every=max(25, cfg["steps"] // 8), keep_checkpoints=1)
    finally:
        book["wall_s"] += time.perf_counter() - t0
        path.mkdir(parents=True, exist_ok=True)
        write_json(book_path, book)
    book.update(pretrain_summary(path))
    write_json(book_path, book)
    shutil.rmtree(path / "checkpoints", ignore_errors=True)  # done: resume state not needed
    return book


def pretrain_summary(path: Path) -> dict:
    """First and last loss and training seconds of a finished pretraining folder."""
    from models.pretraining.pretrain import INFO_FILE

    info = read_json(path / INFO_FILE) or {}
    curve = info.get("loss_curve") or []
    return {"loss_first": curve[0][1] if curve else None,
            "loss_last": curve[-1][1] if curve else None,
            "train_seconds": info.get("train_seconds")}


def row_bundle(row: Row, bundles: dict):
    """laplace / ome need the bundle with the sentence encoder; the others the plain one."""
    return bundles["encoder"]() if row.mechanism in ("laplace", "ome") else bundles["plain"]


# -- one row -----------------------------------------------------------------------------------
def row_config(row: Row, args, data: dict, calib: dict | None, bundle_id: str) -> dict | None:
    """Everything that defines a row's result (None while its η is not calibrated)."""
    params = dict(row.params)
    if row.point is not None:
        if calib is None:
            return None
        params["eta"] = calib["points"][str(row.point)]["eta"]
    vector = row.mechanism in ("laplace", "ome")
    cfg = {"row": row.id, "mechanism": row.mechanism, "params": params,
           "objective": row.objective, "bundle_id": bundle_id,
           "train_sha": data["train_sha"], "dev_sha": data["dev_sha"], "seed": args.seed,
           "epochs": args.vector_epochs if vector else args.epochs,
           "lr": None if vector else args.lr, "batch_size": 32, "max_length": 128}
    if row.objective != "orig" and args.pretrained:
        cfg["pretrain"] = {"given": given_pretraining(Path(args.pretrained), row, params["eta"])}
    elif row.objective != "orig":
        cfg["pretrain"] = {"steps": args.pretrain_steps, "batch": args.pretrain_batch,
                           "lr": args.pretrain_lr, "head_warmup": args.pretrain_head_warmup}
    return cfg


def given_pretraining(path: Path, row: Row, eta: float) -> dict:
    """What identifies a finished ``cloud-api pretrain`` folder given by --pretrained; it
    must have been pretrained for this row (objective, mechanism, η)."""
    from models.pretraining.pretrain import INFO_FILE

    info = read_json(path / INFO_FILE)
    if info is None:
        raise SystemExit(f"error: --pretrained {path}: no {INFO_FILE} (not a finished "
                         "cloud-api pretrain folder)")
    got = (info.get("objective"), info.get("mechanism"))
    if got != (row.objective, row.mechanism) or abs(info.get("eta", 0) - eta) > 1e-6 * eta:
        raise SystemExit(f"error: --pretrained {path} was pretrained with {got[0]} MLM, "
                         f"{got[1]} eta={info.get('eta')}; row {row.id} needs {row.objective} "
                         f"MLM, {row.mechanism} eta={eta}")
    return {"dir": str(path.resolve()), "steps": info.get("steps"),
            "weights_sha": file_sha(path / "model.safetensors")}


def run_row(row: Row, cfg: dict, out: Path, args, data: dict, bundles: dict) -> dict:
    from models.training.experiment import train_from_tsv
    from models.training.finetune import TrainConfig
    from models.versions.version_folder import read_config
    from shared.accounting import summary

    key = key_of(cfg)
    bundle = row_bundle(row, bundles)
    base, pre = None, None
    if "given" in cfg.get("pretrain", {}):
        base = Path(cfg["pretrain"]["given"]["dir"])
        pre = {"dir": str(base), **pretrain_summary(base)}
        pre["wall_s"] = pre["train_seconds"] or 0.0
    elif row.objective != "orig":
        pdir, pcfg = pretrain_dir(out, row, cfg["params"]["eta"], args, bundle)
        pre = ensure_pretrained(pdir, pcfg, bundle)
        pre["dir"] = str(pdir)
        base = pdir
    model_dir = out / "models" / f"{row.id}-{key}"
    tc = TrainConfig(epochs=cfg["epochs"], lr=cfg["lr"], batch_size=cfg["batch_size"],
                     max_length=cfg["max_length"], seed=args.seed)
    log(f"row {row.id}: fine-tune {row.mechanism} {cfg['params']} from "
        f"{OBJECTIVE_NAMES[row.objective]} on {data['n_train']} train / {data['n_dev']} dev")
    t0 = time.perf_counter()
    res = train_from_tsv(data["train"], model_dir, row.mechanism, cfg["params"],
                         dev_tsv=data["dev"], bundle=bundle, base=base, cfg=tc,
                         rng=np.random.default_rng([args.seed, 3]), overwrite=True)
    wall = time.perf_counter() - t0
    g = read_config(res.model_dir)["guarantee"]
    m = res.metrics
    result = {"row": row.id, "key": key, "config": cfg, "accuracy": m["dev"]["accuracy"],
              "macro_f1": m["dev"]["macro_f1"], "best_epoch": m["best_epoch"],
              "last_epoch_accuracy": m["epochs"][-1].get("dev_accuracy"),
              "history": m["epochs"], "n_train": res.n_train, "n_dev": res.n_dev,
              "finetune_wall_s": round(wall, 1), "train_loop_s": m.get("train_seconds"),
              "pretrain": pre, "guarantee": g, "guarantee_summary": summary(g),
              "model_dir": str(res.model_dir), "device": m.get("device"),
              "precision": m.get("precision"), "machine": machine(),
              "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    result["fresh"] = fresh_dev(row, res.model_dir, args, bundles)
    write_json(out / "rows" / f"{row.id}-{key}.json", result)
    log(f"row {row.id}: dev accuracy {result['accuracy']:.4f} (best epoch {m['best_epoch']}, "
        f"last {result['last_epoch_accuracy']:.4f}; all dev, fresh noise "
        f"{result['fresh']['accuracy']:.4f}) in {fmt_s(wall)}; {summary(g)}")
    return result


def fresh_dev(row: Row, model_dir, args, bundles: dict) -> dict:
    """The kept model on every dev row privatized afresh, ``--fresh-draws`` times: noise draws
    the epoch choice never saw (the "dev acc" column is measured on the draw it was chosen
    on). One draw of all 6,735 rows moves accuracy by about ±0.005 (dχ-text at 0.34)."""
    from models.training.experiment import evaluate_tsv

    seeds = [[args.seed, FRESH_STREAM, i] for i in range(args.fresh_draws)]
    t0 = time.perf_counter()
    # each call reloads the model and tokenizes again: ~2 s of a 30-50 s draw
    reps = [evaluate_tsv(model_dir, DATA / "sst2" / "dev.tsv", bundle=row_bundle(row, bundles),
                         rng=np.random.default_rng(seed), progress=False) for seed in seeds]
    acc = [r["accuracy"] for r in reps]
    return {"accuracy": float(np.mean(acc)), "draws": acc, "n": reps[0]["n"],
            "macro_f1": float(np.mean([r["macro_f1"] for r in reps])),
            "seeds": seeds, "wall_s": round(time.perf_counter() - t0, 1)}


def with_fresh(row: Row, res: dict, out: Path, args, bundles: dict) -> dict:
    """A cached row without the fresh-noise evaluation (or with another number of draws)
    gets it now: its model is on disk."""
    f = res.get("fresh")
    if f is not None and len(f.get("draws", [])) == args.fresh_draws:
        return res
    if not Path(res.get("model_dir", "")).is_dir():
        return res
    log(f"row {row.id}: all dev with fresh noise, {args.fresh_draws} draws (cached row)")
    res = {**res, "fresh": fresh_dev(row, res["model_dir"], args, bundles)}
    write_json(out / "rows" / f"{row.id}-{res['key']}.json", res)
    return res


# -- the table ---------------------------------------------------------------------------------
def privacy_cells(row: Row, res: dict | None, calib: dict | None) -> list[str]:
    """η, inversion accuracy, ε published, ε worst case."""
    if row.mechanism == "none":
        return ["—", "1 (plain ids)", "∞", "∞"]
    if row.point is not None:
        c = (calib or {}).get("points", {}).get(str(row.point))
        eta = f"{c['eta']:.2f}" if c else "?"
        inv = f"{c['accuracy']:.4f}" if c else f"(target {row.point:g})"
        worst = "—"
        if res is not None and res["guarantee"]["worst_case"].get("epsilon") is not None:
            worst = f"{res['guarantee']['worst_case']['epsilon']:.0f} / token"
        return [eta, inv, "— (dχ: η·d)", worst]
    if res is None:
        return ["—", "—", "?", "?"]
    g = res["guarantee"]
    return ["—", "—", f"{g['nominal']['epsilon']:.4g}", f"{g['worst_case']['epsilon']:.4g}"]


def fresh_cell(res: dict | None) -> str:
    f = (res or {}).get("fresh")
    if not f:
        return "—" if res else ""
    se = (f["accuracy"] * (1 - f["accuracy"]) / f["n"]) ** 0.5
    return f"{f['accuracy']:.4f} ± {1.96 * se:.4f}" + (
        f" ({min(f['draws']):.4f}–{max(f['draws']):.4f})" if len(f.get("draws", [])) > 1 else "")


def target_verdict(res: dict | None, thr: float) -> str:
    """Judged on the fresh-noise accuracy over all dev; the selection draw's figure beside it."""
    if res is None:
        return "not run"
    f = res.get("fresh")
    if not f:
        return (f"{res['accuracy']:.4f} on the selection draw (no fresh-noise evaluation) -> "
                "not judged")
    return (f"{f['accuracy']:.4f} on all dev with fresh noise, mean of {len(f['draws'])} draws "
            f"({res['accuracy']:.4f} on the "
            f"selection draw) -> {'met' if f['accuracy'] >= thr else 'NOT met'}")


def describe(row: Row) -> str:
    if row.mechanism == "laplace":
        return "laplace (DPNR: ε=1, coordinate, μ=0.1)"
    if row.mechanism == "ome":
        return "ome (OME: ε=1, λ=100)"
    return row.mechanism


def render(rows: list[Row], results: dict, calib: dict | None, args, data: dict,
           started: float) -> str:
    headers = ["row", "mechanism", "η", "inversion", "ε published", "ε worst case",
               "pretraining", "dev acc", "last epoch", "all dev, fresh noise",
               "paper (BERT-base)", "fine-tune", "pretrain"]
    body = []
    for row in display_order(rows):
        res = results.get(row.id)
        pre = (res or {}).get("pretrain") or {}
        if row.objective == "orig":
            pretraining = "—"
        elif args.pretrained:
            pretraining = f"{OBJECTIVE_NAMES[row.objective]} {Path(args.pretrained).name}"
        else:
            pretraining = f"{OBJECTIVE_NAMES[row.objective]} {args.pretrain_steps}×" \
                          f"{args.pretrain_batch}"
        paper = row.paper
        paper_s = "—" if paper is None else (
            f"{paper:.4f}" + (f" (η={PAPER_ETA[row.point]})" if row.point else ""))
        body.append([row.id, describe(row), *privacy_cells(row, res, calib), pretraining,
                     f"{res['accuracy']:.4f}" if res else "not run",
                     f"{res['last_epoch_accuracy']:.4f}" if res else "",
                     fresh_cell(res), paper_s, fmt_s(res["finetune_wall_s"]) if res else "",
                     fmt_s(pre.get("wall_s")) if pre else ""])
    done = [r for r in results.values()]
    compute = sum(r["finetune_wall_s"] for r in done)
    compute += sum((r.get("pretrain") or {}).get("wall_s", 0.0) for r in done)
    compute += (calib or {}).get("seconds", 0.0)
    lines = [
        f"SST-2 dev accuracy, MiniLM-L6-H384 (frozen word embeddings), train subset "
        f"{data['n_train']} of {data['train_total']} sentences (seed {args.seed}), dev "
        f"{data['n_dev']} of {data['dev_total']}; fine-tune {args.epochs} epochs "
        f"(vector MLPs {args.vector_epochs}), batch 32, lr {args.lr or 2e-5:g} (MLP 1e-3), "
        f"max length 128; " + (
            f"pretraining: the given folder {args.pretrained}" if args.pretrained else
            f"pretraining {args.pretrain_steps} steps × {args.pretrain_batch} sequences, "
            f"lr {args.pretrain_lr:g}"),
        table(headers, body),
    ]
    if calib:
        lines.append(f"η calibrated on one fixed noise draw over {calib['n_tokens']} regular "
                     "word pieces of SST-2 dev (edge_agent.report.FixedDraw/target_eta); the "
                     "same η for dchi-text and dchi-embedding: " + ", ".join(
                         f"{p} -> η={c['eta']:.2f} ({c['accuracy']:.4f} ± "
                         f"{1.96 * c['standard_error']:.4f})"
                         for p, c in calib["points"].items()))
    lines.append("dev acc: best epoch (selected on this dev set and its one noise draw, as "
                 "the library keeps it); all dev, fresh noise: that model on all "
                 f"{data['dev_total']} dev rows privatized afresh, mean of "
                 f"{args.fresh_draws} noise draws (rng stream {FRESH_STREAM}), ± 1.96 binomial "
                 "standard errors of one draw, (lowest–highest draw); the targets are judged "
                 "on it; "
                 "paper: Qu et al. 2021 Tables 4/6/7, BERT-base (768-d) at the η with the same "
                 "inversion accuracy (Table 3); fine-tune time includes privatizing train+dev")
    for rid, thr in TARGETS:
        lines.append(f"target {rid} >= {thr:.2f}: {target_verdict(results.get(rid), thr)}")
    lines.append(f"rows done: {len(done)} of {len(rows)}; compute time of the rows shown "
                 f"(calibration + pretraining + fine-tuning, summed over runs): {fmt_s(compute)}"
                 f"; this invocation: {fmt_s(time.perf_counter() - started)}")
    lines.append("command: python -m bench.utility " + shlex.join(sys.argv[1:]))
    lines.append("machine: " + machine())
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=6000, help="training subset size (0 = all)")
    ap.add_argument("--dev", type=int, default=0, help="dev subset size (0 = all 6,735)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--vector-epochs", type=int, default=10,
                    help="epochs of the laplace/ome MLP (cheap)")
    ap.add_argument("--lr", type=float, default=None, help="fine-tuning lr (default 2e-5)")
    ap.add_argument("--pretrain-steps", type=int, default=400)
    ap.add_argument("--pretrain-batch", type=int, default=32)
    ap.add_argument("--pretrain-lr", type=float, default=5e-5)
    ap.add_argument("--pretrain-head-warmup", type=int, default=0,
                    help="first pretraining steps train only the new MLM head")
    ap.add_argument("--pretrained", default=None, metavar="DIR",
                    help="fine-tune the pretraining rows from this finished `cloud-api "
                         "pretrain` folder (its objective, mechanism and eta must be the "
                         "row's) instead of pretraining them here")
    ap.add_argument("--fresh-draws", type=int, default=3,
                    help="noise draws of the all-dev evaluation with fresh noise")
    ap.add_argument("--inversion-tokens", type=int, default=10000,
                    help="dev word pieces for the η calibration")
    ap.add_argument("--seed", type=int, default=0,
                    help="subsets, calibration draw, privatization noise, initialisation")
    ap.add_argument("--only", default=None, help="comma-separated row ids or patterns")
    ap.add_argument("--out", default="out/utility")
    ap.add_argument("--table-only", action="store_true", help="print the table from the cache")
    ap.add_argument("--list", action="store_true", help="list the row ids and exit")
    args = ap.parse_args(argv)
    for name in ("train", "dev", "inversion_tokens"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    for name in ("epochs", "vector_epochs", "pretrain_batch", "fresh_draws"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.pretrain_steps < 1:
        ap.error("--pretrain-steps must be >= 1")
    return args


def select(rows: list[Row], only: str | None) -> list[Row]:
    if not only:
        return rows
    pats = [p.strip() for p in only.split(",") if p.strip()]
    bad = [p for p in pats if not any(fnmatch.fnmatchcase(r.id, p) for r in rows)]
    if bad:
        raise SystemExit(f"error: no row matches {', '.join(bad)} (see --list)")
    return [r for r in rows if any(fnmatch.fnmatchcase(r.id, p) for p in pats)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    started = time.perf_counter()
    args = parse_args(argv)
    rows = all_rows()
    if args.list:
        print("\n".join(r.id for r in rows))
        return 0
    rows = select(rows, args.only)
    out = Path(args.out)
    # Import every module a row needs now, not lazily hours later: a long run must not mix
    # module versions when the working tree changes under it.
    import edge_agent.privatize.encoder  # noqa: F401
    import edge_agent.privatize.privatizer  # noqa: F401
    import models.export.writers  # noqa: F401
    import models.pretraining.pretrain  # noqa: F401
    import models.training.experiment  # noqa: F401
    import models.versions.model_version  # noqa: F401
    from models.training.privatize import SEED_WARNING
    from shared.bundle import EdgeBundle

    if not args.table_only:
        print(SEED_WARNING, file=sys.stderr, flush=True)
    plain = EdgeBundle.from_model(None)
    train_src, dev_src = DATA / "sst2" / "train.tsv", DATA / "sst2" / "dev.tsv"
    tmp = Path(tempfile.mkdtemp(prefix="utility-"))
    try:
        tr, tr_sha, n_tr = subset(train_src, args.train, args.seed, 1, tmp)
        dv, dv_sha, n_dv = subset(dev_src, args.dev, args.seed, 2, tmp)
        data = {"train": tr, "dev": dv, "train_sha": tr_sha, "dev_sha": dv_sha,
                "n_train": n_tr, "n_dev": n_dv, "train_total": len(read_tsv(train_src)),
                "dev_total": len(read_tsv(dev_src))}
        needs_calib = any(r.point is not None for r in rows)
        calib = calibrate(out, plain, dev_src, args.inversion_tokens, args.seed, 0.005,
                          run=needs_calib and not args.table_only)
        enc_cache: dict = {}

        def encoder_bundle():
            if "b" not in enc_cache:
                from models.export.writers import export_bundle

                path = out / "bundle-minilm-encoder"
                if (path / "encoder.onnx").is_file():
                    enc_cache["b"] = EdgeBundle.load(path)
                else:
                    log(f"exporting the MiniLM sentence encoder bundle to {path}")
                    enc_cache["b"] = export_bundle(path)
            return enc_cache["b"]

        bundles = {"plain": plain, "encoder": encoder_bundle}
        results, failed = {}, []
        for row in rows:
            cfg = row_config(row, args, data, calib, plain.bundle_id)
            if cfg is None:
                continue
            cached = read_json(out / "rows" / f"{row.id}-{key_of(cfg)}.json")
            if cached is not None:
                results[row.id] = cached if args.table_only else with_fresh(
                    row, cached, out, args, bundles)
                continue
            if args.table_only:
                continue
            try:
                results[row.id] = run_row(row, cfg, out, args, data, bundles)
            except Exception as exc:  # keep going: the other rows are still worth having
                failed.append(row.id)
                log(f"row {row.id} FAILED: {type(exc).__name__}: {exc}")
                traceback.print_exc()
            text = render(rows, results, calib, args, data, started)
            (out / "table.md").parent.mkdir(parents=True, exist_ok=True)
            (out / "table.md").write_text(text + "\n")
        print(render(rows, results, calib, args, data, started), flush=True)
        if failed:
            print(f"failed rows: {', '.join(failed)}", file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
