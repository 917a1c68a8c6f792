"""Privacy-constrained fine-tuning on privatized records only (Qu et al. 2021 §3.3, §6.1).

AdamW, linear warm-up over the first 10% of the steps then linear decay, batch 32,
maximum length 128, learning rate by argument. Qu et al. use 2e-5 on SST for BERT-base;
the packaged MiniLM reading token ids (``dchi-text``, Null privacy) defaults to 1e-4 over
2 epochs, the recipe that scored best on the full training set (bench results,
"Utility levers"); embeddings keep 2e-5 (no run has shown better), the vector MLP 1e-3. The dev set is evaluated after every epoch and the
best epoch is kept. CUDA with bf16/fp16 autocast when a GPU is present, the same code
path on CPU. The word-embedding table never changes (checked after training).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import cast

import numpy as np
import torch
from torch import nn

from models.nets.backbone import (
    autocast_dtype,
    check_same_bundle,
    keep_layers,
    pick_device,
)
from models.nets.classifiers import VectorMLP, build_classifier, classification_loss
from models.training import distributed
from models.training.data import PayloadDataset, collate_dataset, collate_originals, length_buckets
from models.training.distributed import DistContext
from models.training.objectives import Objective, teacher_targets
from models.training.recipe import DEFAULT_EPOCHS, DEFAULT_LR
from models.versions.version_module import load_backbone
from shared.bundle import EdgeBundle
from shared.mechanisms import registry


class TrainingCancelled(Exception):
    """Raised inside :func:`finetune` when ``should_stop()`` returns True."""


@dataclass
class TrainConfig:
    """Hyperparameters of one fine-tuning run (Qu et al. §6.1 defaults)."""

    epochs: int = DEFAULT_EPOCHS
    lr: float | None = None  # None: DEFAULT_LR of the payload kind
    batch_size: int = 32
    max_length: int = 128
    warmup: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    pooling: str = "mean"
    layers: int | None = None  # keep the first N transformer layers of the base (None: all)
    hidden: tuple[int, ...] = (768, 768, 768)
    seed: int | None = None  # initialisation and batch order only, never the privatization
    device: str = "auto"
    precision: str = "auto"
    eval_batch_size: int = 128
    progress: bool = True
    # levers that need the public text (models.training.objectives): weights 0 = off
    denoise: float = 0.0          # λ of the auxiliary denoising loss
    denoise_rate: float = 0.5     # share of payload positions it scores
    distill: float = 0.0          # α of distillation from a teacher that read the text
    distill_temperature: float = 2.0
    ema: float = 0.0              # decay of the weights' moving average kept and evaluated
    rtd: float = 0.0              # ρ of replaced-token detection (needs the original ids)

    def validate(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be >= 1, got {self.layers}")
        if not 4 <= self.max_length <= 4096:
            raise ValueError(f"max length must be in [4, 4096], got {self.max_length}")
        if self.lr is not None and not (0 < self.lr < 1):
            raise ValueError(f"learning rate must be in (0, 1), got {self.lr}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warm-up fraction must be in [0, 1), got {self.warmup}")
        if not (0 <= self.denoise < 100 and 0 < self.denoise_rate <= 1):
            raise ValueError(f"denoise weight must be in [0, 100) and its rate in (0, 1], got "
                             f"{self.denoise}, {self.denoise_rate}")
        if not 0 <= self.rtd < 100:
            raise ValueError(f"replaced-token detection weight must be in [0, 100), got "
                             f"{self.rtd}")
        if not 0 <= self.ema < 1:
            raise ValueError(f"EMA decay must be in [0, 1), got {self.ema}")
        if not (0 <= self.distill <= 1 and 0 < self.distill_temperature <= 100):
            raise ValueError(f"distillation weight must be in [0, 1] and its temperature in "
                             f"(0, 100], got {self.distill}, {self.distill_temperature}")


@dataclass
class FinetuneResult:
    module: nn.Module
    metrics: dict
    best_epoch: int
    history: list[dict] = field(default_factory=list)


# -- metrics (pure) --------------------------------------------------------------------------
def classification_report(pred: np.ndarray, gold: np.ndarray, names: list[str]) -> dict:
    """Accuracy, per-class precision/recall/F1/support, macro F1, confusion matrix."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    c = len(names)
    conf = np.zeros((c, c), dtype=np.int64)
    np.add.at(conf, (gold, pred), 1)
    return report_from_confusion(conf, names)


def report_from_confusion(conf: np.ndarray, names: list[str]) -> dict:
    """:func:`classification_report` from the confusion matrix (rows gold, columns predicted)."""
    conf = np.asarray(conf, dtype=np.int64)
    per_class = {}
    for i, name in enumerate(names):
        tp = int(conf[i, i])
        p_den, r_den = int(conf[:, i].sum()), int(conf[i, :].sum())
        prec = tp / p_den if p_den else 0.0
        rec = tp / r_den if r_den else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        per_class[name] = {"precision": prec, "recall": rec, "f1": f1, "support": r_den}
    n = int(conf.sum())
    return {"accuracy": float(np.trace(conf) / n) if n else float("nan"), "n": n,
            "macro_f1": float(np.mean([v["f1"] for v in per_class.values()])),
            "per_class": per_class, "confusion": conf.tolist(), "labels": list(names)}


# -- building the model ----------------------------------------------------------------------
def build_model(train: PayloadDataset, bundle: EdgeBundle, base=None,
                cfg: TrainConfig | None = None, posterior=None, denoiser=None) -> nn.Module:
    """The classifier for ``train``'s mechanism, its backbone checked against ``bundle``;
    ``posterior`` (``models.training.posterior.ChannelPosterior``): channel-posterior inputs,
    ``denoiser`` (``models.attacks.denoiser.Denoiser``): contextual ones in their place; both
    checked against the payloads' mechanism, η and bundle."""
    cfg = cfg or TrainConfig()
    if cfg.seed is not None:  # the new head's (or MLP's) initial weights
        torch.manual_seed(cfg.seed)
    n_labels = len(train.label_names)
    if train.kind == "vector":
        if cfg.layers is not None:
            raise ValueError(f"--layers does not apply to {train.mechanism}: its classifier is "
                             "an MLP over the sentence vector, not a BERT")
        model = build_classifier(train.mechanism, n_labels, feature_dim=train.feature_dim(),
                                 hidden=cfg.hidden)
        x = torch.from_numpy(np.stack([np.asarray(a, np.float32) for a in train.arrays]))
        assert isinstance(model, VectorMLP)  # the classifier of every vector kind
        model.fit_input_scaling(x)
        return model
    bert = load_backbone(base)
    check_same_bundle(bert, bundle)
    if cfg.layers is not None:
        keep_layers(bert, cfg.layers)
    if train.kind == "embeddings" and train.feature_dim() != bert.config.hidden_size:
        raise ValueError(f"payload embeddings have dimension {train.feature_dim()}, the "
                         f"backbone {bert.config.hidden_size}")
    if cfg.pooling == "cls" and getattr(bert, "pooler", None) is None:
        raise ValueError("pooling 'cls' needs a BERT with a pooler layer")
    if posterior is not None:
        posterior.check_for(train.mechanism, train.params, bundle.bundle_id)
    if denoiser is not None:
        denoiser.check_for(train.mechanism, train.params, bundle.bundle_id)
        posterior = None  # the denoiser's bias holds it; the classifier reads the denoiser
    return build_classifier(train.mechanism, n_labels, bert=bert, pooling=cfg.pooling,
                            posterior=posterior, regular_ids=bundle.regular_ids,
                            denoiser=denoiser)


def check_token_ids(ds: PayloadDataset, bundle: EdgeBundle, where: str) -> None:
    """ValueError unless every token id of a token-kind dataset is in the vocabulary
    (a private mechanism's: a regular token, the only ids it can output)."""
    if ds.kind != "tokens" or not len(ds):
        return
    ids = np.concatenate([np.asarray(a).ravel() for a in ds.arrays])
    if ids.size and (ids.min() < 0 or ids.max() >= bundle.vocab_size):
        raise ValueError(f"{where} payloads hold token id {int(ids.max())} outside the "
                         f"vocabulary of the bundle [0, {bundle.vocab_size})")
    if registry.get(ds.mechanism).private and ids.size:  # privatized to regular tokens only
        bad = ~np.isin(ids, bundle.regular_ids)
        if bad.any():
            raise ValueError(f"{where} payloads hold token id {int(ids[bad][0])}, not a regular "
                             f"token of the bundle: {ds.mechanism} outputs only regular tokens")


def check_compatible(train: PayloadDataset, dev: PayloadDataset | None,
                     bundle: EdgeBundle) -> None:
    """ValueError unless train, dev and bundle belong together (before any training)."""
    if len(train) == 0:
        raise ValueError("empty training set")
    if train.bundle_id != bundle.bundle_id:
        raise ValueError(f"training payloads name bundle {train.bundle_id[:12]}…, the bundle "
                         f"given is {bundle.bundle_id[:12]}… (pass the bundle the payloads "
                         "were made with: --bundle DIR)")
    check_token_ids(train, bundle, "training")
    if dev is None:
        return
    if len(dev) == 0:
        raise ValueError("empty dev set")
    check_token_ids(dev, bundle, "dev")
    if (dev.mechanism, dev.bundle_id) != (train.mechanism, train.bundle_id):
        raise ValueError("dev records use another mechanism or bundle than the training ones")
    if dev.label_names != train.label_names:
        raise ValueError(f"dev labels {dev.label_names} differ from training labels "
                         f"{train.label_names}")


# -- evaluation ------------------------------------------------------------------------------
def _predict_batches(module: nn.Module, ds: PayloadDataset, batches: list[np.ndarray],
                     special_ids: dict[str, int], max_length: int, device: torch.device,
                     amp: torch.dtype | None):
    """(probabilities of each batch, its loss × its size), one batch after another."""
    was_training = module.training
    module.eval()
    try:
        for idx in batches:
            batch = {k: v.to(device) for k, v in collate_dataset(ds, idx, special_ids,
                                                                 max_length).items()}
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                logits = module(**batch).float()
            tgt = torch.from_numpy(ds.targets[idx]).to(device)
            yield (torch.softmax(logits, dim=-1).cpu().numpy(),
                   float(classification_loss(logits, tgt)) * len(idx))
    finally:
        module.train(was_training)


@torch.no_grad()
def predict_dataset(module: nn.Module, ds: PayloadDataset, special_ids: dict[str, int],
                    max_length: int, device: torch.device | None = None,
                    amp: torch.dtype | None = None, batch_size: int = 128
                    ) -> tuple[np.ndarray, float]:
    """(probabilities (N, C), mean loss) over ``ds`` in its order."""
    device = device or next(module.parameters()).device
    batches = list(length_buckets(ds.lengths(), batch_size, None))
    probs = np.empty((len(ds), len(ds.label_names)), dtype=np.float32)
    total = 0.0
    for idx, (p, loss) in zip(batches, _predict_batches(module, ds, batches, special_ids,
                                                        max_length, device, amp), strict=True):
        total += loss
        probs[idx] = p
    return probs, total / max(1, len(ds))


@torch.no_grad()
def evaluate_dataset(module: nn.Module, ds: PayloadDataset, special_ids: dict[str, int],
                     max_length: int, device: torch.device | None = None,
                     amp: torch.dtype | None = None, batch_size: int = 128,
                     dist_ctx: DistContext | None = None) -> dict:
    """Loss plus :func:`classification_report` (soft targets: their argmax is the gold).

    ``dist_ctx`` (DDP): call on every rank with the same weights; rank r evaluates only
    the batches ``r, r + N, ...`` of the single-process batch list (no sampler padding, no
    example twice), then the confusion matrix and each batch's loss term are all-reduced
    (a batch's term is nonzero on one rank only, so the sum is exact). Every rank returns
    the report a single process gives, bit for bit (each batch holds the same examples, so
    its logits are the same, and the loss terms are added in the same order).
    """
    device = device or next(module.parameters()).device
    batches = list(length_buckets(ds.lengths(), batch_size, None))
    rank, world = (dist_ctx.rank, dist_ctx.world_size) if dist_ctx is not None else (0, 1)
    mine = list(range(rank, len(batches), world))
    gold = ds.targets.argmax(axis=1) if ds.soft else ds.targets
    c = len(ds.label_names)
    conf = np.zeros((c, c), dtype=np.int64)
    terms = np.zeros(len(batches), dtype=np.float64)
    for b, (p, loss) in zip(mine, _predict_batches(module, ds, [batches[b] for b in mine],
                                                   special_ids, max_length, device, amp),
                            strict=True):
        np.add.at(conf, (gold[batches[b]], p.argmax(axis=1)), 1)
        terms[b] = loss
    if dist_ctx is not None:
        summed = distributed.all_sum([*conf.ravel().tolist(), *terms.tolist()], dist_ctx)
        conf = np.rint(np.asarray(summed[:c * c])).astype(np.int64).reshape(c, c)
        terms = np.asarray(summed[c * c:], dtype=np.float64)
    total = 0.0
    for t in terms.tolist():  # in batch order, as predict_dataset adds them
        total += t
    report = report_from_confusion(conf, ds.label_names)
    report["loss"] = total / max(1, len(ds))
    return report


# -- training --------------------------------------------------------------------------------
GATE_LR_FACTOR = 100.0  # the posterior gate: one scalar per dimension, far from BERT's scale


def _param_groups(module: nn.Module, weight_decay: float, lr: float) -> list[dict]:
    decay, no_decay, gates = [], [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if name.endswith("posterior_gate"):
            gates.append(p)
        elif p.ndim < 2 or "LayerNorm" in name or "norm" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay, "lr": lr},
              {"params": no_decay, "weight_decay": 0.0, "lr": lr}]
    if gates:
        groups.append({"params": gates, "weight_decay": 0.0, "lr": lr * GATE_LR_FACTOR})
    return groups


def linear_warmup_decay(step: int, total: int, warmup_steps: int) -> float:
    """LR factor: linear 0 -> 1 over ``warmup_steps``, then linear 1 -> 0 at ``total``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total - step) / max(1, total - warmup_steps))


def finetune(train: PayloadDataset, dev: PayloadDataset | None, bundle: EdgeBundle,
             base: str | os.PathLike | None = None, cfg: TrainConfig | None = None,
             should_stop: Callable[[], bool] | None = None,
             on_progress: Callable[[float, dict], None] | None = None,
             model: nn.Module | None = None,
             dist_ctx: DistContext | None = None,
             refresh: Callable[[int], PayloadDataset] | None = None) -> FinetuneResult:
    """Fine-tune the classifier of ``train``'s mechanism; keep the best dev epoch.

    ``should_stop`` is polled every step (raise :class:`TrainingCancelled`);
    ``on_progress(fraction, info)`` is called after every epoch.
    ``dist_ctx`` (``models.training.distributed.init_from_env()`` under torchrun): DDP, each rank
    trains on its share of the length buckets; every rank returns the same weights.
    The dev set is sharded too (:func:`evaluate_dataset`): each rank evaluates its share
    of the batches and every rank gets the single-process figures.
    ``refresh(epoch)``: the training set of epochs 2, 3, ... (the same examples in the same
    order, privatized afresh: public text only), built in a thread during the epoch before.
    ``cfg.denoise`` reads ``train.extra["originals"]`` (the original ids of each example),
    ``cfg.distill`` ``train.extra["teacher_probs"]`` (N, C): see ``models.training.objectives``.
    """
    cfg = cfg or TrainConfig()
    cfg.validate()
    check_compatible(train, dev, bundle)
    if (cfg.denoise or cfg.rtd) and "originals" not in train.extra:
        raise ValueError("the denoising and replaced-token losses need the original tokens "
                         "(public text only)")
    if cfg.distill and "teacher_probs" not in train.extra:
        raise ValueError("distillation needs a teacher's probabilities (public text only)")
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)
    module = model if model is not None else build_model(train, bundle, base, cfg)
    device = dist_ctx.device if dist_ctx is not None else pick_device(cfg.device)
    amp = autocast_dtype(device, cfg.precision)
    module.to(device)
    objective = Objective(module, denoise=cfg.denoise, denoise_rate=cfg.denoise_rate,
                          distill=cfg.distill, temperature=cfg.distill_temperature,
                          rtd=cfg.rtd).to(device)
    net = distributed.wrap(objective, dist_ctx)  # objective itself when alone
    frozen = _frozen_table(module)
    lr = cfg.lr if cfg.lr is not None else DEFAULT_LR[train.kind]
    opt = torch.optim.AdamW(_param_groups(objective, cfg.weight_decay, lr), lr=lr)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    if dist_ctx is not None:
        steps_per_epoch //= dist_ctx.world_size  # see distributed.shard
    total = steps_per_epoch * cfg.epochs
    warm = max(1, int(round(cfg.warmup * total))) if cfg.warmup > 0 else 0
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: linear_warmup_decay(s, total, warm))
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    seed = cfg.seed
    if dist_ctx is not None and seed is None:  # one batch order, shared by every rank
        entropy = cast(int, np.random.SeedSequence().entropy)  # drawn from the OS: an int
        seed = distributed.broadcast_object(int(entropy % 2**63),
                                            dist_ctx)
    rng = np.random.default_rng(seed)
    special = bundle.special_ids
    # Polyak averaging (an EMA of the weights, torch.optim.swa_utils): what is evaluated
    # and kept; the frozen word table is a constant, which the average leaves bit-identical
    ema = (torch.optim.swa_utils.AveragedModel(
        module, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(cfg.ema),
        use_buffers=True) if cfg.ema else None)
    kept = ema.module if ema is not None else module
    history: list[dict] = []
    best: tuple[float, int, dict] | None = None
    started = time.perf_counter()
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    main = dist_ctx is None or dist_ctx.is_main
    bar = tqdm(total=total, disable=not (cfg.progress and main), unit="step", desc="fine-tune",
               dynamic_ncols=True, mininterval=1.0)
    pool = ThreadPoolExecutor(1, thread_name_prefix="privatize") if refresh else None
    upcoming = None  # the next epoch's fresh privatization, built during this one
    try:
        for epoch in range(1, cfg.epochs + 1):
            if upcoming is not None:
                train = upcoming.result()
                check_compatible(train, None, bundle)
            upcoming = (pool.submit(refresh, epoch + 1) if pool is not None
                        and refresh is not None and epoch < cfg.epochs else None)
            net.train()
            run_loss, run_n, seen = torch.zeros((), device=device), 0, 0
            parts_sum: dict[str, torch.Tensor] = {}
            batches = distributed.shard(list(length_buckets(train.lengths(), cfg.batch_size,
                                                            rng)), dist_ctx)
            for step, idx in enumerate(batches):
                if should_stop is not None and distributed.any_rank(should_stop(), dist_ctx):
                    raise TrainingCancelled("training cancelled")
                batch = {k: v.to(device, non_blocking=True) for k, v in
                         collate_dataset(train, idx, special, cfg.max_length).items()}
                tgt = torch.from_numpy(train.targets[idx]).to(device, non_blocking=True)
                extra = _extra_targets(train, idx, cfg, special, device)
                with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                    loss, _, parts = net(batch, tgt, **extra)
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if cfg.max_grad_norm:
                    scaler.unscale_(opt)
                    nn.utils.clip_grad_norm_(
                        [p for p in objective.parameters() if p.requires_grad],
                        cfg.max_grad_norm)
                scaler.step(opt)
                scaler.update()
                sched.step()
                if ema is not None:
                    ema.update_parameters(module)
                run_loss += parts["task"].detach() * len(idx)
                for k, v in parts.items():
                    parts_sum[k] = parts_sum.get(k, 0.0) + v.detach() * len(idx)
                run_n += len(idx)
                seen += len(idx)
                bar.update(1)
                if step % 20 == 0:
                    bar.set_postfix(epoch=epoch, loss=f"{float(run_loss) / run_n:.4f}")
            if dist_ctx is not None:  # the loss over every rank's share
                loss_sum, n = distributed.all_sum([float(run_loss), run_n], dist_ctx)
                run_loss, run_n = torch.tensor(loss_sum), int(n)
            record = {"epoch": epoch, "train_loss": float(run_loss) / max(1, run_n),
                      "seconds": round(time.perf_counter() - started, 2)}
            record.update({f"train_{k}_loss": float(v) / max(1, seen)
                           for k, v in parts_sum.items() if k != "task"})
            if dev is not None:
                rep = evaluate_dataset(kept, dev, special, cfg.max_length, device, amp,
                                       cfg.eval_batch_size, dist_ctx)
                record.update({"dev_accuracy": rep["accuracy"], "dev_loss": rep["loss"],
                               "dev_macro_f1": rep["macro_f1"]})
                if main:  # tqdm.write prints even when the bar is disabled: rank 0 only
                    bar.write(f"epoch {epoch}: train loss {record['train_loss']:.4f}, dev "
                              f"accuracy {rep['accuracy']:.4f}, dev loss {rep['loss']:.4f}")
                score = rep["accuracy"]
            else:
                score = float(epoch)  # no dev set: keep the last epoch
            history.append(record)
            if best is None or score > best[0]:
                best = (score, epoch, {k: v.detach().to("cpu", copy=True)
                                       for k, v in kept.state_dict().items()})
            if on_progress is not None:
                on_progress(epoch / cfg.epochs, dict(record))
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    assert best is not None
    module.load_state_dict(best[2])
    module.eval()
    _check_frozen(module, frozen)
    if train.kind != "vector":
        check_same_bundle(module.bert, bundle)
    metrics = {"best_epoch": best[1], "epochs": history, "train_examples": len(train),
               "dev_examples": len(dev) if dev is not None else 0, "lr": lr, "ema": cfg.ema,
               "device": str(device), "precision": str(amp).replace("torch.", "") if amp else
               "fp32", "train_seconds": round(time.perf_counter() - started, 2)}
    if dev is not None:
        metrics["dev"] = evaluate_dataset(module, dev, special, cfg.max_length, device, amp,
                                          cfg.eval_batch_size, dist_ctx)
    return FinetuneResult(module, metrics, best[1], history)


def _extra_targets(ds: PayloadDataset, idx: np.ndarray, cfg: TrainConfig,
                   special: dict[str, int], device: torch.device) -> dict:
    """The original ids (denoising) and the teacher's tempered probabilities (distillation)
    of the batch ``idx``, when the recipe uses them."""
    out = {}
    if cfg.denoise or cfg.rtd:
        out["originals"] = collate_originals(ds, idx, special, cfg.max_length).to(device)
    if cfg.distill:
        out["teacher"] = teacher_targets(ds.extra["teacher_probs"][idx],
                                         cfg.distill_temperature).to(device)
    return out


def _frozen_table(module: nn.Module) -> torch.Tensor | None:
    bert = getattr(module, "bert", None)
    if bert is None:
        return None
    w = bert.embeddings.word_embeddings.weight
    if w.requires_grad:
        raise RuntimeError("the word-embedding table must be frozen before training")
    return w.detach().to("cpu", copy=True)


def _check_frozen(module: nn.Module, before: torch.Tensor | None) -> None:
    bert = getattr(module, "bert", None)  # before: its table, read by _frozen_table
    if before is None or bert is None:
        return
    after = bert.embeddings.word_embeddings.weight.detach().cpu()
    if not torch.equal(before, after):
        raise RuntimeError("the frozen word-embedding table changed during training")


def config_dict(cfg: TrainConfig) -> dict:
    """``cfg`` as plain JSON-ready values."""
    d = asdict(cfg)
    d["hidden"] = list(cfg.hidden)
    return d

