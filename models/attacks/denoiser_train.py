"""Training and measuring the contextual denoiser (``models.attacks.denoiser``) on public text.

Every epoch privatizes the whole public text afresh with the exact mechanism
(``shared.mechanisms.DChiText``, its batched search), the next epoch's in a thread while
this one trains; the loss is the cross-entropy of the original token over the candidates
and the copy slot at every privatized position (positions whose original is out of reach
are left out of the loss and count as misses in :func:`recovery`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.attacks.denoiser import Denoiser, new_denoiser
from models.nets.backbone import model_embeddings
from models.training.data import length_buckets
from models.training.finetune import TrainingCancelled, linear_warmup_decay
from shared.mechanisms import DChiText
from shared.mechanisms.int8_pass import cpu_flags
from shared.policy import public_masks
from shared.recovery import neighbour_table, recovery_by_class, token_classes, unchanged_by_class


@dataclass(frozen=True)
class DenoiserConfig:
    layers: int = 2
    candidates: int = 4096
    epochs: int = 2
    lr: float = 3e-4
    batch_size: int = 64
    max_length: int = 128
    warmup: float = 0.05
    weight_decay: float = 0.01
    seed: int | None = None  # initialisation and batch order only
    precision: str = "auto"  # bf16 autocast where the CPU multiplies bf16 natively, else fp32
    progress: bool = True

    def validate(self) -> None:
        if not (1 <= self.layers <= 48 and self.candidates >= 1 and self.epochs >= 1
                and self.batch_size >= 1 and 4 <= self.max_length <= 4096):
            raise ValueError("denoiser: layers in [1, 48], candidates, epochs and batch size "
                             ">= 1, max length in [4, 4096]")
        if not (0 < self.lr < 1 and 0 <= self.warmup < 1):
            raise ValueError(f"denoiser: lr must be in (0, 1) and warm-up in [0, 1), got "
                             f"{self.lr}, {self.warmup}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"denoiser: precision must be auto, fp32 or bf16, got "
                             f"{self.precision!r}")

    def autocast(self) -> torch.dtype | None:
        """The autocast dtype of training on the CPU (None: fp32)."""
        if self.precision == "fp32":
            return None
        if self.precision == "bf16":
            return torch.bfloat16

        return torch.bfloat16 if cpu_flags() & {"avx512_bf16", "amx_bf16"} else None

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("progress")
        d["precision"] = "bf16" if self.autocast() is not None else "fp32"
        return d


def token_sequences(bundle, texts: Sequence[str], max_length: int) -> list[np.ndarray]:
    """The word pieces of every non-empty text as the edge tokenizes it, cut to fit
    ``[CLS] … [SEP]`` in ``max_length``."""
    tok = bundle.text_tokenizer()
    out = []
    for s in range(0, len(texts), 4096):
        for e in tok.encode_batch(list(texts[s:s + 4096]), add_special_tokens=False):
            ids = np.asarray(e.ids[:max_length - 2], dtype=np.int64)
            if ids.size:
                out.append(ids)
    return out


def privatize_sequences(mech, seqs: Sequence[np.ndarray], rng: np.random.Generator | None
                        ) -> list[np.ndarray]:
    """Each sequence privatized by the exact mechanism (one batched call per 64k tokens;
    under a token policy, each sequence's public words decided word by word)."""
    flat = np.concatenate(seqs) if seqs else np.empty(0, np.int64)
    policy = getattr(mech, "policy", None)
    public = public_masks(policy, seqs) if policy is not None and seqs else None
    out = np.empty_like(flat)
    for s in range(0, len(flat), 65536):
        if public is None:
            out[s:s + 65536] = mech.privatize_ids(flat[s:s + 65536], rng)
        else:
            out[s:s + 65536] = mech.privatize_ids(flat[s:s + 65536], rng,
                                                  public=public[s:s + 65536])
    return np.split(out, np.cumsum([len(q) for q in seqs])[:-1])


def collate(ys: Sequence[np.ndarray], xs: Sequence[np.ndarray] | None, special: dict
            ) -> dict[str, torch.Tensor]:
    """``[CLS] y [SEP]`` padded (input_ids, attention_mask) and the originals aligned with
    them (−1 at [CLS], [SEP] and padding)."""
    t = max(len(y) for y in ys) + 2
    ids = np.full((len(ys), t), special["pad"], dtype=np.int64)
    mask = np.zeros((len(ys), t), dtype=np.int64)
    orig = np.full((len(ys), t), -1, dtype=np.int64)
    for i, y in enumerate(ys):
        ids[i, 0], ids[i, len(y) + 1] = special["cls"], special["sep"]
        ids[i, 1:len(y) + 1] = y
        mask[i, :len(y) + 2] = 1
        if xs is not None:
            orig[i, 1:len(y) + 1] = xs[i]
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
            "originals": torch.from_numpy(orig)}


def _batches(lengths: np.ndarray, size: int, rng: np.random.Generator | None):
    return list(length_buckets(lengths, size, rng))


def train_denoiser(bundle, posterior, texts: Sequence[str], cfg: DenoiserConfig | None = None,
                   *, base=None, rng: np.random.Generator | None = None,
                   should_stop: Callable[[], bool] | None = None,
                   log: Callable[[str], None] | None = None) -> Denoiser:
    """A denoiser for ``posterior``'s mechanism and η, trained on the public ``texts``."""
    cfg = cfg or DenoiserConfig()
    cfg.validate()
    seqs = token_sequences(bundle, texts, cfg.max_length)
    if not seqs:
        raise ValueError("the public text has no tokens: no denoiser can be trained")
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)
    model = new_denoiser(posterior, bundle, layers=cfg.layers, candidates=cfg.candidates,
                         base=base, meta={"training": {**cfg.as_dict(), "texts": len(seqs),
                                                       "tokens": int(sum(map(len, seqs)))}})
    mech = DChiText(bundle, posterior.eta, public_p=posterior.public_p)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=cfg.lr)
    lengths = np.array([len(q) for q in seqs])
    order_rng = np.random.default_rng(cfg.seed)
    steps = len(_batches(lengths, cfg.batch_size, None)) * cfg.epochs
    warm = max(1, int(round(cfg.warmup * steps)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: linear_warmup_decay(s, steps, warm))
    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    special = bundle.special_ids
    amp = cfg.autocast()
    model.train()
    started = time.perf_counter()
    history = []
    with ThreadPoolExecutor(1, thread_name_prefix="privatize") as pool:
        upcoming = pool.submit(privatize_sequences, mech, seqs, rng)
        for epoch in range(1, cfg.epochs + 1):
            ys = upcoming.result()
            if epoch < cfg.epochs:
                upcoming = pool.submit(privatize_sequences, mech, seqs, rng)
            tot, hit, n = 0.0, 0, 0
            for step, idx in enumerate(_batches(lengths, cfg.batch_size, order_rng)):
                if should_stop is not None and should_stop():

                    raise TrainingCancelled("training cancelled")
                b = collate([ys[i] for i in idx], [seqs[i] for i in idx], special)
                with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                    logits = model.logits(b["input_ids"], b["attention_mask"]).float()
                tgt = model.targets(b["input_ids"], b["originals"].clamp(min=0))
                tgt = torch.where(b["originals"] < 0, torch.full_like(tgt, -100), tgt)
                loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=-100)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                sched.step()
                valid = tgt >= 0
                k = int(valid.sum())
                tot += float(loss.detach()) * k
                n += k
                hit += int(((logits.argmax(-1) == tgt) & valid).sum())
                if cfg.progress and step % 200 == 0:
                    say(f"denoiser epoch {epoch} step {step}: loss {tot / max(n, 1):.4f}, "
                        f"recovered {hit / max(n, 1):.4f} of reachable tokens, "
                        f"{time.perf_counter() - started:.0f} s")
            history.append({"epoch": epoch, "loss": tot / max(n, 1),
                            "recovered_reachable": hit / max(n, 1),
                            "seconds": round(time.perf_counter() - started, 1)})
            say(f"denoiser epoch {epoch}: {json.dumps(history[-1])}")
    model.meta["training"]["history"] = history
    return model.eval()


def frequency_counts(denoiser: Denoiser | None, posterior, vocab_size: int) -> np.ndarray:
    """Public-text token counts for the rare split (``shared.recovery``): the posterior's
    prior counts, else the denoiser's candidates (the most frequent public tokens) ranked
    first."""
    if posterior is not None:
        return np.asarray(posterior.prior_counts, dtype=np.float64)
    counts = np.zeros(vocab_size)
    if denoiser is not None:
        counts[denoiser.candidates.numpy()] = 1.0
    return counts


def _top_ids(denoiser: Denoiser, input_ids, attention_mask, k: int) -> torch.Tensor:
    """(B, T, k) the denoiser's k most probable originals at every position."""
    n = denoiser.candidates.numel()
    top = denoiser.logits(input_ids, attention_mask).topk(k, -1).indices
    return torch.where(top == n, input_ids.unsqueeze(-1), denoiser.candidates[top.clamp(max=n - 1)])


@torch.no_grad()
def recovery(denoiser: Denoiser | None, posterior, bundle, texts: Sequence[str], *,
             draws: int = 3, rng: np.random.Generator | None = None, max_length: int = 128,
             batch_size: int = 128, by_class: bool = False) -> dict:
    """Shares of the original tokens of ``texts`` that (i) survive the mechanism unchanged,
    (ii) the context-free posterior's argmax recovers (``context_free``: the Monte Carlo
    table's, ``posterior.map_ids``, when a table is given; ``context_free_smoothed``: the
    denoiser's own bias), (iii) the contextual denoiser recovers (when given); mean and each
    of ``draws`` fresh draws, and the share within the denoiser's reach (a candidate or the
    output itself). ``by_class``: also ``by_class`` (``shared.recovery``: all, content and
    rare tokens; the contextual attack's exact, top-5 and semantic recovery, what comes back
    unchanged)."""
    if denoiser is None and posterior is None:
        raise ValueError("recovery needs a posterior table or a denoiser")
    seqs = token_sequences(bundle, texts, max_length)
    if not seqs:
        raise ValueError("no tokens to measure recovery on")
    if posterior is not None:
        eta, public_p = posterior.eta, posterior.public_p
    else:
        assert denoiser is not None  # one of the two, checked above
        eta, public_p = float(denoiser.meta["eta"]), denoiser.meta.get("public_p")
    mech = DChiText(bundle, eta, public_p=public_p)
    map_ids = posterior.map_ids() if posterior is not None else None
    x = np.concatenate(seqs)
    in_cand = np.zeros(bundle.vocab_size, dtype=bool)  # the denoiser's candidates
    if denoiser is not None:
        denoiser.eval()
        in_cand[denoiser.candidates.numpy()] = True
    res: dict[str, list[float]] = {"survive": [], "context_free": [], "contextual": [],
                                   "context_free_smoothed": [], "reachable": []}
    lengths = np.array([len(q) for q in seqs])
    classes = near = None
    splits: list[dict] = []
    unchanged: list[dict] = []
    if by_class:
        classes = token_classes(seqs, bundle.tokenizer.get_vocab(with_added_tokens=True),
                                bundle.regular_ids,
                                frequency_counts(denoiser, posterior, bundle.vocab_size))
        if bundle.has_embeddings:  # the semantic neighbours: the model's own table
            near = neighbour_table(bundle.embeddings, x, bundle.regular_ids)
    for _ in range(draws):
        ys = privatize_sequences(mech, seqs, rng)
        y = np.concatenate(ys)
        res["survive"].append(float((y == x).mean()))
        if map_ids is not None:
            res["context_free"].append(float((map_ids[y] == x).mean()))
        if classes is not None:
            unchanged.append(unchanged_by_class(x, y, classes))
        if denoiser is None:
            if classes is not None and map_ids is not None:
                splits.append(recovery_by_class(x, map_ids[y], classes, near))
            continue
        res["reachable"].append(float(((y == x) | in_cand[x]).mean()))
        pred: dict[int, np.ndarray] = {}  # sequence -> its guesses
        free: dict[int, np.ndarray] = {}
        for idx in _batches(lengths, batch_size, None):
            b = collate([ys[i] for i in idx], None, bundle.special_ids)
            p = _top_ids(denoiser, b["input_ids"], b["attention_mask"], 5).numpy()
            f = denoiser.context_free_ids(b["input_ids"]).numpy()
            for j, i in enumerate(idx):
                pred[i], free[i] = p[j, 1:len(ys[i]) + 1], f[j, 1:len(ys[i]) + 1]
        guesses = np.concatenate([pred[i] for i in range(len(seqs))])
        res["contextual"].append(float((guesses[:, 0] == x).mean()))
        res["context_free_smoothed"].append(float((np.concatenate([free[i] for i in range(len(seqs))]) == x).mean()))
        if classes is not None:
            splits.append(recovery_by_class(x, guesses, classes, near))
    out = {"tokens": int(len(x)), "texts": len(seqs), "draws": draws,
           "mechanism": DChiText.name, "eta": eta}
    for k, v in res.items():
        if v:
            out[k] = float(np.mean(v))
            out[f"{k}_draws"] = v
    if classes is not None:
        out["by_class"] = {
            "attack": "contextual" if denoiser is not None else "context-free",
            "tokens": classes.sizes(),
            "unchanged": {c: float(np.mean([u[c] for u in unchanged])) for c in unchanged[0]},
            "recovery": {c: {m: (float(np.mean([s_[c][m] for s_ in splits]))
                                 if splits and splits[0][c].get(m) is not None else None)
                             for m in ("exact", "top5", "semantic")} for c in classes.masks}
            if splits else None}
    return out


def denoiser_key(bundle_id: str, posterior_digest: str, texts: Sequence[str],
                 cfg: DenoiserConfig, base) -> str:
    """Digest of everything a trained denoiser depends on (its cache name)."""
    h = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    return hashlib.sha256(json.dumps(
        {"bundle": bundle_id, "posterior": posterior_digest, "texts": h,
         "cfg": cfg.as_dict(), "base": str(base)}, sort_keys=True).encode()).hexdigest()[:20]


def public_denoiser(bundle, posterior, texts: Sequence[str], cfg: DenoiserConfig, *,
                    base=None, rng=None, cache: str | os.PathLike | None = None,
                    log: Callable[[str], None] | None = None) -> Denoiser:
    """:func:`train_denoiser`, read from / written to ``cache`` (a folder) under
    :func:`denoiser_key` (written to a temporary name, then renamed)."""
    key = denoiser_key(bundle.bundle_id, posterior.describe().get("digest") or
                       hashlib.sha256(posterior.to_bytes()).hexdigest()[:20], texts, cfg, base)
    path = Path(cache) / f"denoiser-{posterior.mechanism}-{key}.safetensors" if cache else None
    if path is not None and path.is_file():
        try:

            d = Denoiser.load(path, model_embeddings(bundle))
            d.check_for(posterior.mechanism, posterior.params, bundle.bundle_id)
            return d
        except ValueError:
            pass  # unreadable or for something else: train it again
    d = train_denoiser(bundle, posterior, texts, cfg, base=base, rng=rng, log=log)
    d.meta["digest"] = key
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        d.save(path)
    return d


def read_corpus(path: str | os.PathLike) -> list[str]:
    """Non-empty lines of a public text file (one text per line)."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such corpus file")
    try:
        lines = [s.strip() for s in p.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not UTF-8 text ({exc.reason})") from None
    out = [s for s in lines if s]
    if not out:
        raise ValueError(f"{p}: empty corpus")
    return out


