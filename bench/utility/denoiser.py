"""The contextual denoiser (``models.attacks.denoiser``): how many original tokens a server recovers.

    python -m bench.utility denoiser [--eta 65] [--train 0] [--corpus FILE] [--layers 2]
        [--candidates 4096] [--epochs 1] [--draws 3] [--out out/denoiser]
        [--posterior-cache DIR] [--measure-only] [--latency]

On ``sst2_sentences/dev.tsv`` (1,000 held-out sentences) privatized afresh ``--draws`` times
with ``dchi-text`` at ``--eta``, the share of original tokens that

* survive the mechanism unchanged (what the token inversion of the privacy report counts);
* the context-free posterior's argmax recovers (``models.training.posterior``, built from the public
  training text as ``cloud-api train`` builds it);
* the context-free posterior holds in its support, and in its top K for K = 8, 64, 512;
* are among the N most frequent public-text tokens or the output itself (the denoiser's reach);
* the contextual denoiser recovers, trained on the public text (``sst2_sentences/train.tsv``,
  ``--train`` rows of it, 0 = all, plus ``--corpus``), each epoch a fresh privatization.

For the replaced tokens it also prints the rank of the original among the regular tokens by
distance to the output: dχ returns either the original or a word unrelated to it (Asghar et
al. 2024), which is why a context-free candidate list misses it. Denoisers and tables are
cached under ``--out`` by the digest of their inputs; ``--measure-only`` skips the denoiser.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import DATA, machine, table
from bench.utility.cache import write_json

TRAIN = DATA / "sst2_sentences" / "train.tsv"
DEV = DATA / "sst2_sentences" / "dev.tsv"
TOP_K = (8, 64, 512)


def context_free_ranks(posterior, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Rank of each original x in the context-free posterior P(· | y) (0 = argmax), or a
    large number where the table never saw x turn into y."""
    px, py, p = posterior.pairs()
    order = np.lexsort((-p, py))
    xs, ys = px[order], py[order]
    start = np.searchsorted(ys, np.arange(posterior.vocab_size + 1))
    ranks = np.full(len(x), np.iinfo(np.int64).max)
    for i, (xi, yi) in enumerate(zip(x.tolist(), y.tolist(), strict=True)):
        hit = np.flatnonzero(xs[start[yi]:start[yi + 1]] == xi)
        if hit.size:
            ranks[i] = hit[0]
    return ranks


def neighbour_ranks(bundle, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """For each pair, how many regular tokens lie nearer to φ(y) than φ(x) does."""
    emb = np.asarray(bundle.table, dtype=np.float32)  # the privatization space
    reg = emb[bundle.regular_ids]
    n2 = (reg * reg).sum(1)
    out = []
    for s in range(0, len(x), 512):
        ey, ex = emb[y[s:s + 512]], emb[x[s:s + 512]]
        d = n2[None] - 2 * ey @ reg.T
        dx = (ex * ex).sum(1) - 2 * (ex * ey).sum(1)
        out.append((d < dx[:, None]).sum(1))
    return np.concatenate(out) if out else np.empty(0, np.int64)


def measure_context_free(bundle, posterior, dev_texts: list[str], draws: int, seed: int
                         ) -> dict:
    """Survival, the context-free argmax, its support and top-K, and the neighbour ranks."""
    from models.attacks.denoiser_train import privatize_sequences, token_sequences
    from shared.mechanisms import DChiText

    seqs = token_sequences(bundle, dev_texts, 128)
    x = np.concatenate(seqs)
    mech = DChiText(bundle, posterior.eta)
    map_ids = posterior.map_ids()
    keys = ["survive", "context_free", "support"] + [f"top{k}" for k in TOP_K]
    res: dict[str, list[float]] = {k: [] for k in keys}
    near = []
    rng = np.random.default_rng([seed, 31])  # the draws models.attacks.denoiser_train.recovery makes
    for d in range(draws):
        y = np.concatenate(privatize_sequences(mech, seqs, rng))
        ranks = context_free_ranks(posterior, x, y)
        res["survive"].append(float((y == x).mean()))
        res["context_free"].append(float((map_ids[y] == x).mean()))
        res["support"].append(float((ranks < np.iinfo(np.int64).max).mean()))
        for k in TOP_K:
            res[f"top{k}"].append(float((ranks < k).mean()))
        if d == 0:
            changed = y != x
            near = neighbour_ranks(bundle, x[changed], y[changed])
    out = {k: float(np.mean(v)) for k, v in res.items()}
    out["draws"] = res
    out["tokens"] = int(len(x))
    out["changed_nearest"] = {str(k): float((near < k).mean()) for k in (*TOP_K, 4096)}
    out["changed_median_rank"] = float(np.median(near))
    return out


def reach_by_frequency(posterior, bundle, dev_texts: list[str]) -> dict:
    """Share of dev tokens among the N most frequent public-text tokens."""
    from models.attacks.denoiser import candidate_vocabulary
    from models.attacks.denoiser_train import token_sequences

    x = np.concatenate(token_sequences(bundle, dev_texts, 128))
    out = {}
    for n in (1024, 4096, 8192, 16384):
        keep = np.zeros(bundle.vocab_size, dtype=bool)
        keep[candidate_vocabulary(posterior.prior_counts, bundle.regular_ids, n)] = True
        out[str(n)] = float(keep[x].mean())
    return out


def latency(out: Path, bundle, posterior, denoiser, dev_texts: list[str], batches=(1, 32),
            reps: int = 20) -> dict:
    """CPU milliseconds per request of the exported classifier (fp32 and int8 ONNX, one
    thread) of MiniLM reading the context-free table and of MiniLM reading ``denoiser``
    inside the graph, on privatized dev sentences: process time, so other jobs on the
    machine weigh less than on wall-clock. The heads are untrained: the cost is the same."""
    from models.export.onnx_classifier import OnnxClassifier
    from models.export.writers import export_classifier_onnx
    from models.nets.backbone import load_bert
    from models.nets.classifiers import build_classifier
    from models.training.data import collate_payloads
    from models.training.privatize import make_privatizer
    from models.versions.model_version import save_model_version
    from shared.mechanisms import DChiText

    cfg = {"kind": "tokens", "mechanism": "dchi-text", "params": {"eta": posterior.eta},
           "bundle_id": bundle.bundle_id, "special_ids": bundle.special_ids,
           "labels": ["0", "1"], "max_length": 128}
    priv = make_privatizer(bundle, DChiText(bundle, posterior.eta), 128)
    items = priv.tokenize(dev_texts)
    payloads = [r.payload for r in priv.records_tokenized(items, [0] * len(items),
                                                          num_labels=2)]
    res = {}
    for name, kw in (("table", {"posterior": posterior}), ("denoiser", {"denoiser": denoiser})):
        path = out / "latency" / name
        if not (path / "classifier.int8.onnx").is_file():
            model = build_classifier("dchi-text", 2, bert=load_bert(None), **kw)
            save_model_version(path, model, cfg, {}, {}, overwrite=True)
            export_classifier_onnx(path)
        for int8 in (False, True):
            clf = OnnxClassifier(path, threads=1, int8=int8)
            for b in batches:
                n = min(reps, len(payloads) // b)
                feeds = [collate_payloads(payloads[i:i + b], clf.config, as_numpy=True)
                         for i in range(0, b * n, b)]
                clf.logits(feeds[0])
                t0 = time.process_time()
                for f in feeds:
                    clf.logits(f)
                res[f"{name}/{'int8' if int8 else 'fp32'}/batch{b}"] = \
                    1000 * (time.process_time() - t0) / (b * n)
    return res


def render(res: dict, args) -> str:
    cf = res["context_free"]
    pct = "{:.2%}".format
    rows = [["survive unchanged (= token inversion)", pct(cf["survive"]),
             " ".join(f"{v:.4f}" for v in cf["draws"]["survive"])],
            ["context-free posterior argmax", pct(cf["context_free"]),
             " ".join(f"{v:.4f}" for v in cf["draws"]["context_free"])],
            ["context-free posterior: original in its support", pct(cf["support"]), ""]]
    rows += [[f"context-free posterior: original in its top {k}", pct(cf[f"top{k}"]), ""]
             for k in TOP_K]
    den = res.get("contextual")
    if den:
        rows.append([f"within the denoiser's reach ({args.candidates} most frequent public "
                     "tokens, or the output)", pct(den["reachable"]), ""])
        rows.append(["its context-free part alone (the smoothed posterior it starts from)",
                     pct(den["context_free_smoothed"]),
                     " ".join(f"{v:.4f}" for v in den["context_free_smoothed_draws"])])
        rows.append(["**contextual denoiser**", f"**{pct(den['contextual'])}**",
                     " ".join(f"{v:.4f}" for v in den["contextual_draws"])])
    lines = [
        f"dchi-text eta={args.eta:g}, MiniLM-L6-H384 bundle; sst2_sentences/dev.tsv "
        f"({cf['tokens']:,} tokens of 1,000 sentences), {args.draws} fresh privatizations",
        table(["original tokens that …", "share (mean)", "draws"], rows),
        "replaced tokens: the original among the regular tokens nearest to the output: " +
        ", ".join(f"top {k}: {pct(v)}" for k, v in cf["changed_nearest"].items()) +
        f"; median rank {cf['changed_median_rank']:,.0f} of 29,523",
        "dev tokens among the N most frequent public-text tokens: " +
        ", ".join(f"{n}: {pct(v)}" for n, v in res["frequent"].items()),
    ]
    if den:
        tr = den["training"]
        lines.append(f"denoiser: {tr['layers']} layers of MiniLM, {tr['candidates']} "
                     f"candidates, {tr['epochs']} epoch(s) over {tr['texts']:,} public texts "
                     f"({tr['tokens']:,} tokens), lr {tr['lr']:g}, batch {tr['batch_size']}; "
                     f"trained in {tr['history'][-1]['seconds']:.0f} s" if tr.get("history")
                     else "denoiser: from the cache")
    lat = res.get("latency")
    if lat:
        rows = []
        for fmt in ("fp32", "int8"):
            for b in (1, 32):
                t, d = lat[f"table/{fmt}/batch{b}"], lat[f"denoiser/{fmt}/batch{b}"]
                rows.append([fmt, b, f"{t:.2f}", f"{d:.2f}", f"{t / d:.2f}"])
        lines += ["exported classifier (MiniLM-L6), CPU ms per request on one thread "
                  "(process time), privatized dev sentences:",
                  table(["onnx", "batch", "context-free table", "denoiser in the graph",
                         "ratio (req/s with / without)"], rows)]
    lines.append("command: python -m bench.utility " + shlex.join(sys.argv[1:]))
    lines.append(f"machine: {machine()}; load average at the end "
                 f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m bench.utility denoiser",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--eta", type=float, default=65.0)
    ap.add_argument("--train", type=int, default=0, help="first N training rows (0 = all)")
    ap.add_argument("--corpus", action="append", default=[], metavar="FILE",
                    help="more public text, one per line (repeatable)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--candidates", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="out/denoiser")
    ap.add_argument("--posterior-cache", default=None, metavar="DIR",
                    help="where context-free tables are kept (default OUT/posteriors)")
    ap.add_argument("--measure-only", action="store_true",
                    help="the context-free figures only (no denoiser)")
    ap.add_argument("--latency", action="store_true",
                    help="also the exported classifier's CPU time with and without the "
                         "denoiser in its graph")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from models.attacks.denoiser_train import DenoiserConfig, public_denoiser, read_corpus, recovery
    from models.training.data import read_labelled_tsv
    from models.training.levers import public_posterior
    from models.training.privatize import SEED_WARNING
    from models.training.recipe import Recipe
    from shared.bundle import EdgeBundle

    print(SEED_WARNING, file=sys.stderr, flush=True)
    out = Path(args.out)
    bundle = EdgeBundle.from_model(None)
    train = read_labelled_tsv(TRAIN, args.train or None)
    corpus = [t for f in args.corpus for t in read_corpus(f)]
    dev = read_labelled_tsv(DEV).texts
    t0 = time.perf_counter()
    post = public_posterior(bundle, "dchi-text", {"eta": args.eta}, train.texts, Recipe(),
                            np.random.default_rng([args.seed, 7]),
                            Path(args.posterior_cache or out / "posteriors"), progress=True)
    res = {"context_free": measure_context_free(bundle, post, dev, args.draws, args.seed),
           "frequent": reach_by_frequency(post, bundle, dev), "posterior": post.describe()}
    if not args.measure_only:
        cfg = DenoiserConfig(layers=args.layers, candidates=args.candidates,
                             epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                             seed=args.seed)
        d = public_denoiser(bundle, post, train.texts + corpus, cfg,
                            rng=np.random.default_rng([args.seed, 11]), cache=out / "denoisers")
        rec = recovery(d, post, bundle, dev, draws=args.draws,
                       rng=np.random.default_rng([args.seed, 31]))
        rec["training"] = {**d.meta["training"], "layers": args.layers,
                           "candidates": args.candidates}
        res["contextual"] = rec
        if args.latency:
            res["latency"] = latency(out, bundle, post, d, dev)
    res["seconds"] = time.perf_counter() - t0
    res["args"] = vars(args)
    write_json(out / "results" / f"eta{args.eta:g}-{int(time.time())}.json", res)
    print(render(res, args), flush=True)
    return 0


def train_for_frontier(bundle, posterior, cache: Path, *, epochs: int = 1,
                       corpus: str | None = None, texts_limit: int = 0, draws: int = 3,
                       seed: int = 0) -> dict:
    """The contextual attack of ``python -m bench.utility frontier``: this bench's denoiser
    (2 layers, 4,096 candidates, the first ``texts_limit`` training sentences (0 = all) +
    ``corpus``) retrained for ``bundle``'s table and ``posterior``'s η, and its recovery on
    the dev tokens."""
    from models.attacks.denoiser_train import DenoiserConfig, public_denoiser, read_corpus, recovery
    from models.training.data import read_labelled_tsv

    texts = read_labelled_tsv(TRAIN, texts_limit or None).texts + (
        read_corpus(corpus) if corpus else [])
    cfg = DenoiserConfig(layers=2, candidates=4096, epochs=epochs, seed=seed, progress=False)
    t0 = time.perf_counter()
    d = public_denoiser(bundle, posterior, texts, cfg, rng=np.random.default_rng([seed, 11]),
                        cache=cache)
    t1 = time.perf_counter()
    rec = recovery(d, posterior, bundle, read_labelled_tsv(DEV).texts, draws=draws,
                   rng=np.random.default_rng([seed, 31]))
    return {"contextual": rec["contextual"], "contextual_draws": rec["contextual_draws"],
            "context_free": rec.get("context_free"), "survive": rec["survive"],
            "tokens": rec["tokens"], "denoiser_s": t1 - t0, "texts": len(texts),
            "epochs": epochs, "machine": machine()}
