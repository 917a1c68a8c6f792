"""One training recipe on a seeded subset of whole sentences: the exploration that chose the
levers ``python -m bench.utility levers`` ablates.

    python -m bench.utility explore --name NAME [--n 10000] [--epochs 1] [--lr 1e-4]
        [--fresh] [--denoise LAMBDA] [--posterior TABLE.npz] [--denoiser FILE]
        [--distill ALPHA --teacher DIR]
        [--warm DIR] [--layers N] [--eta 64.35] [--mech dchi-text] [--save DIR]
        [--out out/exp/results.jsonl]

Lower-level than ``python -m bench.utility levers`` (which goes through ``train_from_tsv``, the path of
``cloud-api train``): it drives ``models.training.finetune`` directly, so that one lever at a time can be
varied on a subset quickly. It prints one JSON line (and appends it to ``--out``):

* ``sent_mean`` / ``sent_draws``: ``sst2_sentences/dev.tsv`` (1,000 whole sentences held out
  from training) privatized afresh 3 times;
* ``phrase2000``: the first 2,000 rows of ``sst2/dev.tsv`` (phrase level, one draw);
* ``train_s``: the fine-tuning loop's wall seconds.

The subset is ``--n`` rows of ``sst2_sentences/train.tsv`` drawn with seed 11; the epoch is
chosen on one fixed privatization of the dev set (seed [5, 99]), the reported draws are others.
``--posterior FILE`` reads a table of ``models.training.posterior.build_posterior``, built first from the
whole training text (1 pass, 16 draws at least per distinct token, seed 7) when FILE does not
exist; ``--teacher`` / ``--warm`` take a model fine-tuned on the clean text (``--mech none
--save DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.common import DATA, machine


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.utility explore",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--n", type=int, default=10000, help="training rows (0 = all)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--fresh", action="store_true", help="privatize afresh every epoch")
    ap.add_argument("--denoise", type=float, default=0.0)
    ap.add_argument("--denoise-rate", type=float, default=0.5)
    ap.add_argument("--posterior", help="channel-posterior table (.npz)")
    ap.add_argument("--denoiser", help="a trained contextual denoiser (models.attacks.denoiser), read "
                    "in place of the posterior table (python -m bench.utility denoiser)")
    ap.add_argument("--distill", type=float, default=0.0)
    ap.add_argument("--teacher", help="clean-text model for --distill")
    ap.add_argument("--warm", help="start from this clean-text model's weights")
    ap.add_argument("--rtd", type=float, default=0.0,
                    help="weight of replaced-token detection (0 = off)")
    ap.add_argument("--ema", type=float, default=0.0,
                    help="decay of the weights' moving average kept and evaluated (0 = off)")
    ap.add_argument("--layers", type=int, default=0, help="keep the first N layers (0 = all)")
    ap.add_argument("--eta", type=float, default=64.35)
    ap.add_argument("--mech", default="dchi-text")
    ap.add_argument("--table", default="none",
                    help="the privatization table (shared.table: none, pca32-int8, ...)")
    ap.add_argument("--policy", default="none",
                    help="the token policy (shared.policy: none, function-words, ...)")
    ap.add_argument("--public-p", type=float, default=None,
                    help="under a policy: the probability that a public word is privatized")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--save", help="save the kept model here")
    ap.add_argument("--out", default="out/exp/results.jsonl")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    run(parse_args(argv))
    return 0


def run(a: argparse.Namespace) -> dict:
    """Train and evaluate one recipe; the JSON record (also printed and appended)."""
    import torch

    from models.nets.backbone import keep_layers
    from models.training.data import label_names_from, read_labelled_tsv
    from models.training.finetune import (
        TrainConfig,
        build_model,
        evaluate_dataset,
        finetune,
        predict_dataset,
    )
    from models.training.posterior import ChannelPosterior
    from models.training.privatize import PublicText, build_mechanism, make_privatizer
    from models.versions.model_version import load_model, save_model_version
    from shared.bundle import EdgeBundle

    if a.threads:
        torch.set_num_threads(a.threads)
    b = EdgeBundle.from_model(table=None if a.table == "none" else a.table, policy=a.policy)
    tr = read_labelled_tsv(DATA / "sst2_sentences" / "train.tsv")
    if a.n and a.n < len(tr.texts):
        idx = np.sort(np.random.default_rng(11).choice(len(tr.texts), a.n, replace=False))
        tr.texts = [tr.texts[i] for i in idx]
        tr.labels = [tr.labels[i] for i in idx]
    dv = read_labelled_tsv(DATA / "sst2_sentences" / "dev.tsv")
    ph = read_labelled_tsv(DATA / "sst2" / "dev.tsv", 2000)
    names = label_names_from(tr.labels)
    params = {"eta": a.eta} if a.mech != "none" else {}
    if a.mech != "none" and a.policy != "none":
        params["public_p"] = a.public_p
    priv = make_privatizer(b, build_mechanism(a.mech, b, **params), 128)
    pt, pdv, pph = (PublicText(d, names, priv) for d in (tr, dv, ph))
    rng = np.random.default_rng(1)
    t0 = time.time()
    teacher_probs = None
    if a.distill:
        mv = load_model(a.teacher)
        clean = PublicText(tr, names, make_privatizer(b, "none", 128)).dataset(None,
                                                                             progress=False)
        teacher_probs, _ = predict_dataset(mv.module, clean, b.special_ids, 128)

    def make(epoch: int):
        ds = pt.dataset(rng, originals=a.denoise > 0 or a.rtd > 0, progress=False)
        if teacher_probs is not None:
            ds.extra["teacher_probs"] = teacher_probs
        return ds

    train = make(1)
    dev0 = pdv.dataset(np.random.default_rng([5, 99]), progress=False)
    post = None
    if a.posterior and Path(a.posterior).exists():
        post = ChannelPosterior.load(a.posterior)
    elif a.posterior:  # built from the whole training text, as `cloud-api train` builds one
        from models.training.posterior import build_posterior

        whole = read_labelled_tsv(DATA / "sst2_sentences" / "train.tsv")
        post = build_posterior(b, a.mech, a.eta, whole.texts, passes=1.0, min_draws=16,
                               rng=np.random.default_rng(7), public_p=params.get("public_p"))
        post.save(a.posterior)
    cfg = TrainConfig(epochs=a.epochs, lr=a.lr, seed=0, progress=False, denoise=a.denoise,
                      denoise_rate=a.denoise_rate, distill=a.distill, batch_size=a.batch,
                      ema=a.ema, rtd=a.rtd)
    den = None
    if a.denoiser:
        from models.attacks.denoiser import Denoiser
        from models.nets.backbone import model_embeddings

        den = Denoiser.load(a.denoiser, model_embeddings(b))
    model = build_model(train, b, a.warm, cfg, posterior=post, denoiser=den)
    if a.layers:
        keep_layers(model.bert, a.layers)
    t1 = time.time()
    res = finetune(train, dev0, b, cfg=cfg, model=model, refresh=make if a.fresh else None)
    t2 = time.time()
    m = res.module
    accs = [evaluate_dataset(m, pdv.dataset(np.random.default_rng([5, i]), progress=False),
                             b.special_ids, 128)["accuracy"] for i in range(3)]
    pha = evaluate_dataset(m, pph.dataset(np.random.default_rng([6, 0]), progress=False),
                           b.special_ids, 128)["accuracy"]
    out = {"name": a.name, "args": vars(a), "history": res.history,
           "best_epoch": res.best_epoch, "sent_draws": accs, "sent_mean": float(np.mean(accs)),
           "phrase2000": pha, "train_s": t2 - t1, "total_s": time.time() - t0,
           "machine": machine(), "load": os.getloadavg()}
    if (post is not None or den is not None) and hasattr(m, "posterior_gate"):
        out["gate"] = float(torch.sigmoid(m.posterior_gate).mean())
    print(json.dumps(out), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "a") as f:
        f.write(json.dumps(out) + "\n")
    if a.save:
        save_model_version(a.save, m, {"kind": train.kind, "mechanism": a.mech,
                                       "params": train.params, "bundle_id": b.bundle_id,
                                       "special_ids": b.special_ids, "labels": names,
                                       "max_length": 128}, {}, {}, overwrite=True)
    return out
