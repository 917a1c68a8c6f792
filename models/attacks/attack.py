"""Evaluation of privacy on the server side (``cloud-api evaluate --attack``).

* dχ mechanisms (Qu et al. 2021 §5.3–5.4): token embedding inversion accuracy on the
  tokens of a data set and the plausible-deniability statistics N_w / S_w, computed by
  the edge's report code (``edge_agent.report``) with the mechanism of
  ``shared.mechanisms.DChiText``. On a GPU only the candidate pass of the exact
  nearest-token search moves to torch (``models.nets.torch_nearest.TorchExactNearest``), so
  the whole vocabulary × 1,000 perturbations is practical; the noise is still
  ``shared.mechanisms.sample_dchi_noise``.
* Sentence-vector mechanisms (``laplace``, ``ome``, ``texthide``): an attacker MLP trained
  on payloads to tell which of the W most frequent content words a sentence contains
  (Lyu et al. 2020 DPNR §4.5: one binary task per private attribute, a 2-layer MLP of 512
  units), scored on held-out sentences against the majority baseline, and beside it the
  same attacker on the unprivatized encoder vectors.
"""

from __future__ import annotations

import csv
import math
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_agent.report import CONTEXTUAL_NOTE, build_report, format_report
from models.attacks.denoiser import Denoiser
from models.attacks.denoiser_train import recovery
from models.nets.backbone import model_embeddings, pick_device
from models.nets.classifiers import VectorMLP
from models.nets.torch_nearest import TorchExactNearest
from models.training.privatize import chunk_indices, make_privatizer
from models.versions.version_folder import DENOISER_FILE, is_model_dir
from shared.accounting import guarantee, summary
from shared.bundle import EdgeBundle
from shared.mechanisms import DChiText, registry


# -- input -----------------------------------------------------------------------------------
def read_sentences(path: str | os.PathLike, limit: int | None = None) -> list[str]:
    """Sentences of a TSV with a ``sentence`` (or ``sentence_a``) column, else one per line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    csv.field_size_limit(sys.maxsize)
    out: list[str] = []
    try:
        with open(p, newline="", encoding="utf-8") as f:
            first = f.readline()
            header = [h.strip() for h in first.rstrip("\n").split("\t")]
            col = next((header.index(c) for c in ("sentence", "sentence_a") if c in header),
                       None)
            if col is None:
                f.seek(0)
                lines = (line.strip() for line in f)
            else:
                lines = (row[col].strip() for row in
                         csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if len(row) > col)
            for s in lines:
                if s:
                    out.append(s)
                if limit is not None and len(out) >= limit:
                    break
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text ({exc.reason})") from None
    if not out:
        raise ValueError(f"{p}: empty data set (no sentences)")
    return out


# -- exact nearest token on torch ------------------------------------------------------------
class TorchDChiText(DChiText):
    """``shared.mechanisms.DChiText`` with its nearest-token search on a torch device;
    the noise (``sample_dchi_noise``) and everything else are the shared code."""

    def __init__(self, bundle: EdgeBundle, eta: float, device: torch.device | str):
        super().__init__(bundle, eta, chunk=1024)
        self.index = TorchExactNearest(self.exact, device)


def dchi_text_on(bundle: EdgeBundle, eta: float, device: torch.device) -> DChiText:
    """The text-to-text mechanism with the search on ``device`` (numpy on CPU)."""
    if device.type == "cpu":
        return DChiText(bundle, eta, chunk=1024)
    return TorchDChiText(bundle, eta, device)


# -- token privacy (dχ) ----------------------------------------------------------------------
def token_privacy(bundle: EdgeBundle, mechanism: str, *, eta: float | None = None,
                  target: float | None = None, texts: list[str] | None = None,
                  tokens: int | str | None = None, samples: int = 1000,
                  inversion_tokens: int = 20000, rng: np.random.Generator | None = None,
                  device: str = "auto", tol: float = 0.005):
    """Inversion accuracy on the tokens of ``texts`` and N_w/S_w over ``tokens`` regular
    tokens ("all" = the whole vocabulary; default all on a GPU, 500 on CPU), each perturbed
    ``samples`` times. Returns ``edge_agent.report.PrivacyReport``."""
    if eta is not None and not (eta > 0 and math.isfinite(eta)):
        raise ValueError(f"eta must be a finite number > 0, got {eta!r}")
    dev = pick_device(device)
    if tokens is None:
        tokens = "all" if dev.type == "cuda" else 500
    n_tokens = int(bundle.regular_ids.size) if tokens == "all" else int(tokens)
    rep = build_report(bundle, mechanism, eta=eta, target=target, texts=texts or None,
                       tokens=n_tokens, samples=samples, inversion_tokens=inversion_tokens,
                       rng=rng, tol=tol, mech=dchi_text_on(bundle, eta or 1.0, dev),
                       max_queries=200_000 if dev.type == "cuda" else 20_000)
    rep.timings["device"] = str(dev)
    return rep


def token_report_json(rep) -> dict:
    d = rep.to_json()
    d.pop("n_w", None)
    d.pop("s_w", None)
    return d


def format_token_report(rep, contextual: dict | None = None) -> str:
    text = format_report(rep)
    if contextual is not None:  # the measured figure in place of the pointer to it
        text = text.replace(CONTEXTUAL_NOTE.format(eta=f"{rep.eta:.4g}"),
                            format_contextual(contextual))
    return text + f"\n(device {rep.timings.get('device', 'cpu')})"


# -- contextual attack (models.attacks.denoiser) -----------------------------------------------------
def load_denoiser(source, bundle: EdgeBundle, mechanism: str, eta: float,
                  public_p: float | None = None):
    """The denoiser of a model version folder, or a denoiser file, checked against the
    mechanism, η and bundle attacked (ValueError, one line)."""

    path = Path(source)
    if is_model_dir(path):
        if not (path / DENOISER_FILE).is_file():
            raise ValueError(f"{path}: this model version reads no contextual denoiser")
        path = path / DENOISER_FILE
    d = Denoiser.load(path, model_embeddings(bundle))
    d.check_for(mechanism, {"eta": eta, **({"public_p": public_p} if public_p is not None
                                            else {})}, bundle.bundle_id)
    return d


def contextual_attack(denoiser, bundle: EdgeBundle, texts: list[str], *, draws: int = 3,
                      rng: np.random.Generator | None = None, source: str = "") -> dict:
    """Shares of the tokens of ``texts`` a server recovers from fresh privatizations
    (``models.attacks.denoiser_train.recovery``): unchanged, context-free, contextual."""
    t0 = time.perf_counter()
    rec = recovery(denoiser, None, bundle, texts, draws=draws, rng=rng, by_class=True)
    rec.pop("context_free", None)
    rec.pop("context_free_draws", None)
    tr = denoiser.meta.get("training") or {}
    rec["denoiser"] = {"source": str(source), "layers": denoiser.bert.config.num_hidden_layers,
                       "candidates": int(denoiser.candidates.numel()),
                       "public_texts": tr.get("texts"), "public_tokens": tr.get("tokens"),
                       "epochs": tr.get("epochs")}
    rec["seconds"] = time.perf_counter() - t0
    return rec


def format_contextual(rec: dict) -> str:
    d = rec["denoiser"]
    trained = (f"trained on {d['public_texts']:,} public texts" if d.get("public_texts")
               else "untrained")
    return "\n".join([
        f"contextual attack (server side): a server with a contextual model of public text "
        f"recovers {100 * rec['contextual']:.1f}% of tokens at this eta",
        f"  on {rec['tokens']:,} tokens of the data, mean of {rec['draws']} fresh "
        f"privatizations; the same tokens: {100 * rec['survive']:.1f}% come back unchanged "
        f"(the token inversion), the context-free posterior recovers "
        f"{100 * rec['context_free_smoothed']:.1f}%",
        f"  denoiser {d['source']}: {d['layers']} layers, {d['candidates']:,} candidates, "
        f"{trained}; the published guarantee above still holds; this is what "
        "our own server can undo",
        *format_by_class(rec.get("by_class"))])


def format_by_class(bc: dict | None) -> list[str]:
    """The recovery split by token class (``shared.recovery``), one line per class."""
    if not bc:
        return []
    pct = "{:.1f}%".format
    out = [f"  by token class ({bc['attack']} attack; content: not a word of the standard "
           "stop list; rare: outside the 4,096 most frequent public-text tokens):"]
    for c, n in bc["tokens"].items():
        r = (bc.get("recovery") or {}).get(c) or {}
        parts = [f"unchanged {pct(100 * bc['unchanged'][c])}"]
        for m, what in (("exact", "recovered"), ("top5", "in its top 5"),
                        ("semantic", "recovered or a near word")):
            if r.get(m) is not None:
                parts.append(f"{what} {pct(100 * r[m])}")
        out.append(f"    {c} ({n:,} tokens): " + ", ".join(parts))
    return out


# -- sentence-vector attack ------------------------------------------------------------------
STOPWORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been before
being below between both but by can can't cannot could couldn't did didn't do does doesn't
doing don't down during each few for from further had hadn't has hasn't have haven't having
he he'd he'll he's her here here's hers herself him himself his how how's i i'd i'll i'm i've
if in into is isn't it it's its itself let's me more most mustn't my myself no nor not of off
on once only or other ought our ours ourselves out over own same shan't she she'd she'll she's
should shouldn't so some such than that that's the their theirs them themselves then there
there's these they they'd they'll they're they've this those through to too under until up
very was wasn't we we'd we'll we're we've were weren't what what's when when's where where's
which while who who's whom why why's with won't would wouldn't you you'd you'll you're you've
your yours yourself yourselves also just one even much would could may might us will n't 's lrb rrb
""".split())
_WORD = re.compile(r"[a-z][a-z'-]*[a-z]|[a-z]")


def words_of(text: str) -> set[str]:
    """Lower-cased words of ``text`` (letters, inner apostrophes and hyphens)."""
    return set(_WORD.findall(text.lower()))


def content_words(texts: list[str], n: int = 30, min_length: int = 3) -> list[str]:
    """The ``n`` content words in most texts (stop words and short words left out)."""
    df = Counter(w for t in texts for w in words_of(t)
                 if len(w) >= min_length and w not in STOPWORDS)
    return [w for w, _ in sorted(df.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def word_presence(texts: list[str], words: list[str]) -> np.ndarray:
    """(N, W) 0/1: does text i contain word j."""
    out = np.zeros((len(texts), len(words)), dtype=np.float32)
    index = {w: j for j, w in enumerate(words)}
    for i, t in enumerate(texts):
        for w in words_of(t):
            if w in index:
                out[i, index[w]] = 1.0
    return out


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, average ranks for ties); NaN with one class."""
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if not n_pos or not n_neg:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = np.asarray(scores)[order]
    ranks = np.empty(len(s), dtype=np.float64)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i: j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def train_attacker(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                   y_test: np.ndarray, *, hidden: int = 512, epochs: int = 30,
                   lr: float = 1e-3, batch_size: int = 64, device: str = "auto",
                   seed: int | None = None) -> dict:
    """Train a 2-layer MLP (``hidden`` ReLU units, DPNR §4.2) with one sigmoid output per
    word on (x_train, y_train); score each word on the test split.

    Per word: attacker accuracy at threshold 0.5, the majority baseline (the training
    majority class applied to the test split), F1 of "present", and ROC AUC (0.5 = chance).
    """
    dev = pick_device(device)
    gen = torch.Generator().manual_seed(seed if seed is not None else
                                        int(np.random.default_rng().integers(2**31)))
    x_tr = torch.from_numpy(np.asarray(x_train, np.float32))
    # a coordinate constant in training keeps scale 1 (as VectorMLP): an OME bit never set
    # in training would otherwise be multiplied by 1e6 at test time
    mu, sd = x_tr.mean(0), x_tr.std(0)
    sd = torch.where(sd < VectorMLP.MIN_STD, torch.ones_like(sd), sd)
    x_tr = ((x_tr - mu) / sd).to(dev)
    y_tr = torch.from_numpy(np.asarray(y_train, np.float32)).to(dev)
    x_te = ((torch.from_numpy(np.asarray(x_test, np.float32)) - mu) / sd).to(dev)
    w = y_tr.shape[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        net = nn.Sequential(nn.Linear(x_tr.shape[1], hidden), nn.ReLU(),
                            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, w)).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    n = x_tr.shape[0]
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen).to(dev)
        for s in range(0, n, batch_size):
            idx = perm[s: s + batch_size]
            loss = loss_fn(net(x_tr[idx]), y_tr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    with torch.no_grad():
        prob = torch.sigmoid(net(x_te)).cpu().numpy()
    y_te = np.asarray(y_test) > 0.5
    prevalence = np.asarray(y_train).mean(axis=0)
    per_word = []
    for j in range(w):
        pred = prob[:, j] >= 0.5
        yj = y_te[:, j]
        majority = yj == (prevalence[j] >= 0.5)
        tp = int((pred & yj).sum())
        prec = tp / max(1, int(pred.sum()))
        rec = tp / max(1, int(yj.sum()))
        per_word.append({"accuracy": float((pred == yj).mean()),
                         "majority_accuracy": float(majority.mean()),
                         "f1": 2 * prec * rec / (prec + rec) if prec + rec else 0.0,
                         "auc": roc_auc(prob[:, j], yj),
                         "test_prevalence": float(yj.mean())})
    keys = ("accuracy", "majority_accuracy", "f1", "auc")
    mean = {k: float(np.nanmean([p[k] for p in per_word])) for k in keys}
    return {"per_word": per_word, "mean": mean}


def _clean_vectors(privatizer, items) -> np.ndarray:
    """Encoder outputs of the unprivatized sequences (no word dropout): the reference."""
    cls, sep = privatizer.special["cls"], privatizer.special["sep"]
    seqs, types = [], []
    for it in items:
        first = np.concatenate([[cls], it.ids_a, [sep]]).astype(np.int64)
        if it.ids_b is None:
            seqs.append(first)
            types.append(np.zeros(first.size, dtype=np.int64))
        else:
            second = np.concatenate([it.ids_b, [sep]]).astype(np.int64)
            seqs.append(np.concatenate([first, second]))
            types.append(np.r_[np.zeros(first.size), np.ones(second.size)].astype(np.int64))
    return privatizer.encoder.encode(seqs, types)


def vector_attack(bundle: EdgeBundle, mechanism, texts: list[str], *, n_words: int = 30,
                  test_fraction: float = 0.3, rng: np.random.Generator | None = None,
                  device: str = "auto", max_length: int = 128, progress: bool = True,
                  reference: bool = True, epochs: int = 30) -> dict:
    """Attacker MLP recovering the presence of the ``n_words`` most frequent content words
    from payloads of ``mechanism`` (a sentence-vector one: laplace, ome, texthide), on
    held-out sentences."""

    name = getattr(mechanism, "name", str(mechanism))
    vectors = [c.name for c in registry.mechanisms() if not c.payload_kind.reads_tokens]
    if name not in vectors:
        raise ValueError(f"the attacker MLP is for {', '.join(vectors[:-1])} and "
                         f"{vectors[-1]}, got {name!r}")
    if not 0 < test_fraction < 1:
        raise ValueError("test_fraction must be in (0, 1)")
    rng = rng if rng is not None else np.random.default_rng()
    t0 = time.perf_counter()
    # measuring an attack on public data is how a weak parameter is shown to be weak: the
    # floor does not stop it, the report says so (``weak_privacy``)
    priv = make_privatizer(bundle, mechanism, max_length, allow_weak_privacy=True)
    items = priv.tokenize(texts, allow_empty=True)
    keep = [i for i, it in enumerate(items) if it is not None]
    texts = [texts[i] for i in keep]
    items = [items[i] for i in keep]
    if len(items) < 20:
        raise ValueError(f"the attack needs at least 20 sentences, got {len(items)}")
    words = content_words(texts, n_words)
    if not words:
        raise ValueError("no content words in the data")
    y = word_presence(texts, words)
    feats = []
    for idx in chunk_indices(list(range(len(items))), 256, getattr(mechanism, "k", 1)):
        recs = priv.records_tokenized([items[i] for i in idx], [0] * len(idx), num_labels=2,
                                      rng=rng)
        feats += [r.payload.data_array() for r in recs]
    x = np.stack(feats).astype(np.float32)
    perm = rng.permutation(len(items))
    n_test = max(1, int(round(test_fraction * len(items))))
    te, tr = perm[:n_test], perm[n_test:]
    seed = int(rng.integers(2**31))
    result = train_attacker(x[tr], y[tr], x[te], y[te], device=device, seed=seed,
                            epochs=epochs)
    out = {"mechanism": name, "params": dict(mechanism.params), "bundle_id": bundle.bundle_id,
           "sentences": len(items), "train": int(tr.size), "test": int(te.size),
           "words": words, "attacker": result}
    if reference:
        clean = _clean_vectors(priv, items)
        out["reference_unprivatized"] = train_attacker(clean[tr], y[tr], clean[te], y[te],
                                                       device=device, seed=seed,
                                                       epochs=epochs)

    out["guarantee"] = guarantee(mechanism, bundle)
    out["weak_privacy"] = priv.weak_privacy  # None, or why it is below the floor
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def format_vector_attack(rep: dict) -> str:
    """The attack result as plain text."""
    a = rep["attacker"]["mean"]
    lines = [f"attacker MLP on {rep['mechanism']} payloads (DPNR §4.5 style): presence of the "
             f"{len(rep['words'])} most frequent content words, {rep['train']} training / "
             f"{rep['test']} test sentences",
             f"  privatized:   accuracy {a['accuracy']:.4f} (majority {a['majority_accuracy']:.4f})"
             f", F1 {a['f1']:.4f}, AUC {a['auc']:.4f}"]
    if "reference_unprivatized" in rep:
        r = rep["reference_unprivatized"]["mean"]
        lines.append(f"  unprivatized: accuracy {r['accuracy']:.4f} (majority "
                     f"{r['majority_accuracy']:.4f}), F1 {r['f1']:.4f}, AUC {r['auc']:.4f}")
    lines.append("  word            prevalence  acc     majority  F1      AUC")
    for w, p in zip(rep["words"], rep["attacker"]["per_word"], strict=True):
        lines.append(f"  {w:<15} {p['test_prevalence']:<11.3f} {p['accuracy']:<7.4f} "
                     f"{p['majority_accuracy']:<9.4f} {p['f1']:<7.4f} {p['auc']:.4f}")
    lines.append("guarantee: " + summary(rep["guarantee"]))
    if rep.get("weak_privacy"):
        lines.append(f"WEAK PRIVACY: {rep['weak_privacy']} (edge-agent privatize refuses "
                     "these parameters without --allow-weak-privacy)")
    lines.append(f"(computed in {rep['seconds']:.1f} s)")
    return "\n".join(lines)
