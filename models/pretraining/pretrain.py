"""Privacy-adaptive pretraining (Qu et al. 2021 §3.4, settings of §6.1).

Continue BERT's masked-LM pretraining on a public corpus that is privatized on
the fly with the task's own mechanism and η, with NO gradient into the
word-embedding table (the edge's, user side: §3.4 stops the gradient there so
the privacy protection stays what it was). Objectives: Vanilla, Prob and
Denoising MLM (``models.pretraining.mlm``). Next-sentence prediction, which Qu et al. keep
beside MLM, is left out: the corpus is single sentences and documents (AG News,
SST-2), and RoBERTa showed MLM alone pretrains as well; pair tasks fine-tune the
same BERT with its segment embeddings.

    from models.pretraining.pretrain import pretrain
    out = pretrain(None, "out/denoise-65", "denoising", "dchi-text", 65.0, steps=1000)

The output folder is a Hugging Face BERT folder (``config.json``,
``model.safetensors``, tokenizer files) usable as ``--base`` for fine-tuning,
plus ``mlm_head.safetensors`` and ``pretrain.json``; ``checkpoints/step-N/``
hold everything needed to resume exactly.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from models.nets.backbone import (
    autocast_dtype,
    check_same_bundle,
    freeze_word_embeddings,
    load_bert,
    pick_device,
    resolve_model_dir,
)
from models.pretraining.mlm import OBJECTIVES, MLMHead, mlm_loss
from models.pretraining.pretrain_data import (
    BatchPrivatizer,
    MLMBatch,
    batch_indices,
    build_batch,
    default_corpus_paths,
    read_corpus,
    step_rng,
    tokenize_corpus,
)
from models.training import distributed
from models.training.finetune import TrainingCancelled
from shared.accounting import guarantee
from shared.bundle import EdgeBundle
from shared.floor import check_computable, require_privacy_floor
from shared.mechanisms import registry

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
HEAD_FILE, STATE_FILE, INFO_FILE = "mlm_head.safetensors", "trainer_state.pt", "pretrain.json"


@dataclass
class PretrainConfig:
    """What defines a run (a resumed run must match it; see ``RESUME_KEYS``)."""

    objective: str
    mechanism: str
    eta: float
    steps: int | None = None
    epochs: int | None = None
    batch_size: int = 32
    max_length: int = 128
    lr: float = 5e-5
    warmup_ratio: float = 0.01      # §6.1: 10,000 warm-up steps of 1,000,000
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    head_warmup_steps: int = 0      # first steps train only the new MLM head (encoder frozen)
    prob_k: int = 10
    mask_rate: float = 0.15
    max_predictions: int = 20
    save_every: int = 0             # 0: only at the end
    keep_checkpoints: int = 2
    seed: int | None = None

    def validate(self) -> None:
        """ValueError with one clear sentence for anything that cannot run."""
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r} (choose vanilla, prob or denoising)")
        if self.mechanism not in registry.dchi_names():
            raise ValueError(f"unknown mechanism {self.mechanism!r} for pretraining "
                             f"(choose {' or '.join(registry.dchi_names())})")
        if not (isinstance(self.eta, int | float) and math.isfinite(self.eta) and self.eta > 0):
            raise ValueError(f"--eta must be a positive finite number, got {self.eta}")
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of --steps and --epochs")
        for name in ("steps", "epochs"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"--{name} must be at least 1, got {v}")
        checks = [("batch-size", self.batch_size >= 1), ("max-length", self.max_length >= 3),
                  ("lr", self.lr > 0), ("prob-k", self.prob_k >= 1),
                  ("mask-rate", 0 < self.mask_rate <= 1), ("max-predictions", self.max_predictions >= 1),
                  ("save-every", self.save_every >= 0), ("warmup-ratio", 0 <= self.warmup_ratio < 1),
                  ("keep-checkpoints", self.keep_checkpoints >= 1),
                  ("head-warmup-steps", self.head_warmup_steps >= 0)]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"--{name} is out of range: {getattr(self, name.replace('-', '_'))}")


RESUME_KEYS = ("objective", "mechanism", "eta", "batch_size", "max_length", "lr", "warmup_ratio",
               "weight_decay", "max_grad_norm", "prob_k", "mask_rate", "max_predictions",
               "head_warmup_steps")


class MaskedLM(nn.Module):
    """BertModel + tied MLM head; forward returns the MLM loss of a device batch."""

    def __init__(self, bert, head: MLMHead):
        super().__init__()
        self.bert, self.head = bert, head

    def forward(self, input_ids, attention_mask, masked_pos, targets, embeds=None, embed_pos=None,
                train_encoder: bool = True):
        with torch.set_grad_enabled(train_encoder and torch.is_grad_enabled()):
            if embeds is None:
                out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            else:
                x = compose_inputs_embeds(self.bert.embeddings.word_embeddings, input_ids, embeds,
                                          embed_pos)
                out = self.bert(inputs_embeds=x, attention_mask=attention_mask)
        hidden = out.last_hidden_state
        picked = hidden.reshape(-1, hidden.shape[-1])[masked_pos]
        return mlm_loss(self.head(picked), targets)


@torch.no_grad()
def compose_inputs_embeds(word_embeddings: nn.Embedding, input_ids: torch.Tensor,
                          embeds: torch.Tensor, embed_pos: torch.Tensor) -> torch.Tensor:
    """dchi-embedding input (B, L, n): the frozen rows E[id] for [CLS]/[SEP]/[PAD]/[MASK],
    the perturbed rows at ``embed_pos`` (flat positions); BERT adds position and segment
    embeddings and LayerNorm on top (the layout of ``models.training.data``)."""
    x = word_embeddings(input_ids)
    x.view(-1, x.shape[-1])[embed_pos] = embeds.to(x.dtype)
    return x


def build_model(bert) -> MaskedLM:
    """Freeze the word embeddings and attach a fresh tied head (initialised as BERT's)."""
    freeze_word_embeddings(bert)
    cfg = bert.config
    head = MLMHead(bert.embeddings.word_embeddings, cfg.hidden_size, cfg.layer_norm_eps)
    head.reset_parameters(cfg.initializer_range)
    return MaskedLM(bert, head)


# Hugging Face BertForMaskedLM names of the head (older checkpoints: LayerNorm gamma/beta)
_HF_HEAD = {"dense.weight": ("cls.predictions.transform.dense.weight",),
            "dense.bias": ("cls.predictions.transform.dense.bias",),
            "layer_norm.weight": ("cls.predictions.transform.LayerNorm.weight",
                                  "cls.predictions.transform.LayerNorm.gamma"),
            "layer_norm.bias": ("cls.predictions.transform.LayerNorm.bias",
                                "cls.predictions.transform.LayerNorm.beta"),
            "bias": ("cls.predictions.bias", "cls.predictions.decoder.bias")}


def load_base_head(head: MLMHead, base: Path) -> str | None:
    """Start from the base folder's own MLM head when it has one: a privbert pretraining
    output (``mlm_head.safetensors``) or a Hugging Face BERT with its pretraining head
    (``cls.predictions.*`` in ``model.safetensors``, e.g. bert-base-uncased). MiniLM ships
    none. Returns where the head came from, or None (the fresh head stays)."""
    from safetensors import safe_open

    want = {k: v.shape for k, v in head.trainable_state_dict().items()}
    found: dict[str, torch.Tensor] = {}
    if (base / HEAD_FILE).is_file():
        with safe_open(str(base / HEAD_FILE), "pt") as f:
            found = {k: f.get_tensor(k) for k in f.keys() if k in want}
        source = str(base / HEAD_FILE)
    elif (base / "model.safetensors").is_file():
        with safe_open(str(base / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
            for ours, names in _HF_HEAD.items():
                name = next((n for n in names if n in keys), None)
                if name is not None:
                    found[ours] = f.get_tensor(name)
        source = f"{base / 'model.safetensors'} (cls.predictions)"
    if set(found) != set(want) or any(found[k].shape != want[k] for k in want):
        return None  # no head, or one of another shape: keep the fresh one
    head.load_state_dict({k: v.float() for k, v in found.items()}, strict=False)
    return source


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW as BERT: no decay on biases and LayerNorm; frozen parameters excluded."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim == 1 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, eps=1e-6)


def batch_to_device(batch: MLMBatch, device: torch.device) -> dict[str, torch.Tensor]:
    pin = device.type == "cuda"

    def t(a):
        x = torch.from_numpy(np.ascontiguousarray(a))
        return x.pin_memory().to(device, non_blocking=True) if pin else x

    out = {"input_ids": t(batch.input_ids), "attention_mask": t(batch.attention_mask),
           "masked_pos": t(batch.masked_pos), "targets": t(batch.targets)}
    if batch.embeds is not None:
        out["embeds"], out["embed_pos"] = t(batch.embeds), t(batch.embed_pos)
    return out


class Trainer:
    """One optimisation step at a time: autocast, (scaled) backward, clip, AdamW, schedule."""

    def __init__(self, model: MaskedLM, cfg: PretrainConfig, total_steps: int,
                 device: torch.device, amp: torch.dtype | None,
                 dist_ctx: distributed.DistContext | None = None):
        from transformers import get_linear_schedule_with_warmup

        self.model, self.device, self.amp = model.to(device), device, amp
        # DDP under torchrun; BERT's pooler gets no gradient from the MLM loss (nor the
        # encoder during the head warm-up): DDP must look for unused parameters
        self.net = distributed.wrap(self.model, dist_ctx, find_unused_parameters=True)
        self.max_grad_norm = cfg.max_grad_norm
        self.head_warmup_steps = cfg.head_warmup_steps
        self.optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
        warmup = int(round(cfg.warmup_ratio * total_steps))
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, warmup, total_steps)
        self.scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None
        self.params = [p for p in model.parameters() if p.requires_grad]

    def autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp)

    def step(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """One step; returns the loss (a detached tensor, no device sync)."""
        self.model.train()
        # MiniLM ships no MLM head: optionally fit the new head alone first, so its random
        # start does not send large gradients into the pretrained encoder.
        train_encoder = self.scheduler.last_epoch >= self.head_warmup_steps
        with self.autocast():
            loss = self.net(**tensors, train_encoder=train_encoder)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


# -- checkpoints ----------------------------------------------------------------------------
def save_model_folder(model: MaskedLM, folder: Path, base_dir: Path) -> None:
    """Hugging Face BERT folder (safetensors) + tokenizer files of the base + the head."""
    from safetensors.torch import save_file

    model.bert.save_pretrained(str(folder))
    save_file({k: v.detach().cpu().contiguous() for k, v in model.head.trainable_state_dict().items()},
              str(folder / HEAD_FILE))
    for name in TOKENIZER_FILES:
        if (base_dir / name).is_file() and not (folder / name).exists():
            shutil.copyfile(base_dir / name, folder / name)


def save_checkpoint(out_dir: Path, step: int, model: MaskedLM, trainer: Trainer, run: dict,
                    base_dir: Path, keep: int) -> Path:
    """checkpoints/step-N (written under a temporary name, then renamed); older ones pruned."""
    root = out_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step-{step:08d}", root / f".tmp-step-{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model_folder(model, tmp, base_dir)
    state = {"step": step, "trainer": trainer.state(), "run": run,
             "torch_rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in list_checkpoints(out_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(out_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(out_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / STATE_FILE).is_file())


# -- the run --------------------------------------------------------------------------------
def corpus_fingerprint(seqs: list[np.ndarray]) -> str:
    import hashlib

    h = hashlib.sha256(np.array([s.size for s in seqs], dtype=np.int64).tobytes())
    for s in seqs:
        h.update(s.astype(np.int32).tobytes())
    return h.hexdigest()


def pretrain(base_dir: str | os.PathLike | None, out_dir: str | os.PathLike, objective: str,
             mechanism: str, eta: float, corpus_texts: list[str] | None = None,
             steps: int | None = None, batch_size: int = 32, *, epochs: int | None = None,
             corpus_paths: list[str | os.PathLike] | None = None, bundle: EdgeBundle | None = None,
             device: str = "auto", precision: str = "auto", resume: bool = False,
             progress: bool = True, prefetch: bool | None = None, search: str | None = None,
             should_stop=None, on_progress=None,
             dist_ctx: distributed.DistContext | None = None,
             allow_weak_privacy: bool = False, **options) -> Path:
    """Privacy-adaptive pretraining; returns ``out_dir`` (a BERT folder usable as a base).

    ``corpus_texts`` (a list of public texts) or ``corpus_paths`` (files; default: AG News
    and the SST-2 training sentences). ``bundle`` defaults to the edge bundle of
    ``base_dir`` (None = the default MiniLM). ``options``: any other ``PretrainConfig``
    field (lr, max_length, prob_k, mask_rate, max_predictions, save_every, seed, ...).
    ``search``: the exact nearest-token search, "numpy" (``shared``, the default on CPU) or
    "torch" (same noise, same answer, GEMM on the training device; the default on CUDA).
    ``prefetch``: build the next batch in a thread while the device trains (default on CUDA).
    ``should_stop()`` is polled every step (raises ``models.training.finetune.TrainingCancelled``);
    ``on_progress(fraction, {"step", "total", "loss"})`` is called whenever the loss is
    logged (about 200 times a run). ``dist_ctx`` (``models.training.distributed``, under torchrun):
    DDP, a step is one batch per rank (rank r takes the batches the single-process run
    takes at steps ``step * world + r``); rank 0 writes the checkpoints and the output.
    ``tokens_seen`` and ``predictions_seen`` (checkpoints and ``pretrain.json``) count every
    rank's batches: each rank's new tokens are all-reduced whenever a checkpoint is written,
    so a resumed run reports what an uninterrupted one does.

    ``resume`` needs the world size the checkpoint was written with (recorded in it): the
    number of processes fixes the global batch (``batch_size`` × N), which corpus batches a
    step takes and, with ``epochs``, the number of steps, so continuing with another N would
    silently skip or repeat batches; that is refused with a ValueError naming both sizes.
    A checkpoint from before the world size was recorded resumes with a warning (its counts
    are rank 0's alone if it was written under DDP).
    Raises ValueError (one sentence) before any training on bad input, among it an η weaker
    than the privacy floor (``shared.floor``; a task at that η would be refused, so a base
    adapted to it serves nothing) unless ``allow_weak_privacy``, and an η too small to
    compute.
    """
    if steps is None and epochs is None:
        epochs = 1
    cfg = PretrainConfig(objective=objective, mechanism=mechanism, eta=eta, steps=steps,
                         epochs=epochs, batch_size=batch_size, **options)
    cfg.validate()
    out = Path(out_dir)
    base = resolve_model_dir(base_dir)
    checkpoints = list_checkpoints(out)
    if resume and not checkpoints:
        raise ValueError(f"--resume: no checkpoint in {out / 'checkpoints'}")
    if not resume and (checkpoints or (out / INFO_FILE).exists()):
        raise ValueError(f"{out} already holds a pretraining run: pass --resume or another --out")
    if bundle is None:
        bundle = EdgeBundle.from_model(base)
    dev = dist_ctx.device if dist_ctx is not None else pick_device(device)
    search = search or ("torch" if dev.type == "cuda" else "numpy")
    # the task's mechanism (and its exact nearest-token index), built once: the floor is
    # judged on it before anything is read or loaded
    privatizer = BatchPrivatizer(bundle, cfg.mechanism, cfg.eta, search=search, device=dev)
    weak = privacy_floor(privatizer.mechanism_object, bundle, allow_weak_privacy)
    world, rank = (dist_ctx.world_size, dist_ctx.rank) if dist_ctx is not None else (1, 0)
    main = rank == 0
    amp = autocast_dtype(dev, precision)
    if corpus_texts is None:
        corpus_texts = read_corpus(corpus_paths or default_corpus_paths())
    seqs = tokenize_corpus(bundle, corpus_texts, cfg.max_length)
    if not seqs:
        raise ValueError("the corpus is empty (no line with a token)")
    per_epoch = -(-len(seqs) // cfg.batch_size)
    if cfg.steps is not None:
        total = cfg.steps
    else:
        assert cfg.epochs is not None  # PretrainConfig: steps or epochs
        total = -(-cfg.epochs * per_epoch // world)

    bert = load_bert(checkpoints[-1] if resume else base)
    check_same_bundle(bert, bundle)
    if cfg.max_length > bert.config.max_position_embeddings:
        raise ValueError(f"--max-length {cfg.max_length} exceeds the model's "
                         f"{bert.config.max_position_embeddings} positions")
    run = {"config": asdict(cfg),
           "total_steps": total, "bundle_id": bundle.bundle_id, "corpus": corpus_fingerprint(seqs),
           "entropy": distributed.broadcast_object(
               str(cfg.seed if cfg.seed is not None else secrets.randbits(128)), dist_ctx),
           "tokens_seen": 0, "predictions_seen": 0, "loss_curve": [], "train_seconds": 0.0,
           "world_size": world}
    state = None
    if resume:
        state = torch.load(checkpoints[-1] / STATE_FILE, map_location="cpu", weights_only=True)
        _check_world_size(state["run"], world, checkpoints[-1], warn=main)
        _check_resumable(state["run"], run)
        run = state["run"]
        run["world_size"] = world
    entropy = int(run["entropy"])
    if state is None:
        torch.manual_seed(int(np.random.SeedSequence(entropy, spawn_key=(2,)).generate_state(1)[0]))
    model = build_model(bert)
    head_source = None if state is not None else load_base_head(model.head, base)
    if state is None:
        run["head"] = head_source or "new (BERT initialisation)"
    if state is not None:
        from safetensors.torch import load_file

        res = model.head.load_state_dict(load_file(str(checkpoints[-1] / HEAD_FILE)), strict=False)
        if res.unexpected_keys or set(res.missing_keys) != {"decoder.weight"}:
            raise ValueError(f"{checkpoints[-1] / HEAD_FILE}: not an MLM head of this model")
    trainer = Trainer(model, cfg, total, dev, amp, dist_ctx)
    start = 0
    if state is not None:
        trainer.load_state(state["trainer"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        start = int(state["step"])

    def make(step: int) -> MLMBatch:
        step = step * world + rank  # this rank's share of the single-process schedule
        idx = batch_indices(len(seqs), cfg.batch_size, entropy, step)
        return build_batch([seqs[i] for i in idx], privatizer, cfg.objective, step_rng(entropy, step),
                           mask_rate=cfg.mask_rate, max_predictions=cfg.max_predictions,
                           prob_k=cfg.prob_k)

    out.mkdir(parents=True, exist_ok=True)
    log_every = max(1, total // 200)
    use_prefetch = dev.type == "cuda" if prefetch is None else prefetch
    # Under DDP each rank adds only its own batches to run's counts; at every checkpoint
    # (and at the end) the new tokens of every rank since the last sync are all-reduced, so
    # that the counts saved and reported are global, and a resumed run (every rank starts
    # from the checkpoint's global count) adds each rank's tokens once only.
    synced = {k: run[k] for k in _COUNTS}

    def sync_counts() -> None:
        if dist_ctx is None:
            return
        new = distributed.all_sum([run[k] - synced[k] for k in _COUNTS], dist_ctx)
        for k, n in zip(_COUNTS, new, strict=True):
            run[k] = synced[k] = synced[k] + int(n)

    def save(step: int) -> None:
        sync_counts()  # a collective: every rank calls save at the same steps
        if main:
            save_checkpoint(out, step, model, trainer, run, base, cfg.keep_checkpoints)

    _loop(model, trainer, make, start, total, run, log_every, use_prefetch, progress and main,
          save=save, save_every=cfg.save_every, should_stop=should_stop,
          on_progress=on_progress, dist_ctx=dist_ctx)
    sync_counts()  # already global (the last step saves): a no-op kept for safety
    if not main:
        return out
    save_model_folder(model, out, base)
    info = {"objective": cfg.objective, "mechanism": cfg.mechanism, "eta": cfg.eta,
            "bundle_id": bundle.bundle_id, "base": str(base), "steps": total,
            "head": run.get("head"),
            "tokens_seen": run["tokens_seen"], "predictions_seen": run["predictions_seen"],
            "sequences": len(seqs), "loss_curve": run["loss_curve"],
            "train_seconds": round(run["train_seconds"], 1), "device": str(dev),
            "precision": str(amp).replace("torch.", "") if amp else "fp32",
            "world_size": world, "config": run["config"], "corpus_sha256": run["corpus"],
            "guarantee": guarantee(privatizer.mechanism_object, bundle),
            **({"weak_privacy": weak} if weak else {}),
            "paper": "Qu et al. 2021 §3.4; word embeddings frozen (no gradient into the edge's table)"}
    (out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return out


def privacy_floor(mech, bundle: EdgeBundle, allow_weak: bool) -> str | None:
    """The floor's reason for ``mech`` (DChiText or DChiEmbedding) when ``allow_weak`` (None
    above the floor); WeakPrivacyError (a ValueError) below it otherwise; ValueError for an
    η the noise cannot be computed at."""
    check_computable(mech, bundle)
    return require_privacy_floor(mech, bundle, allow_weak=allow_weak)


_COUNTS = ("tokens_seen", "predictions_seen")


def _check_world_size(saved: dict, world: int, checkpoint: Path, warn: bool) -> None:
    """ValueError unless the checkpoint was written by ``world`` processes (see
    :func:`pretrain`); a warning when the checkpoint does not say."""
    before = saved.get("world_size")
    if before is None:
        if warn:
            import warnings

            warnings.warn(f"--resume: {checkpoint} does not record the number of processes "
                          f"that wrote it; resuming with {world}. If it was written by another "
                          "number, batches are skipped or repeated; if under DDP, its "
                          "tokens_seen counts rank 0's batches only", stacklevel=3)
        return
    if int(before) != world:
        raise ValueError(f"--resume: {checkpoint} was written by {before} process(es), this "
                         f"run has {world}; a step takes one batch per process, so another "
                         "number would change the global batch and skip or repeat corpus "
                         f"batches: resume with {before} process(es) (torchrun "
                         f"--nproc-per-node {before})")


def _check_resumable(saved: dict, now: dict) -> None:
    for key in RESUME_KEYS:
        if saved["config"][key] != now["config"][key]:
            raise ValueError(f"--resume: {key} was {saved['config'][key]!r} in the checkpoint, "
                             f"now {now['config'][key]!r}; resume with the same settings")
    for key, what in (("total_steps", "number of steps"), ("bundle_id", "bundle"),
                      ("corpus", "corpus")):
        if saved[key] != now[key]:
            raise ValueError(f"--resume: the {what} differs from the checkpoint's; "
                             "resume with the same settings")


def _window_loss(window: list[torch.Tensor], dist_ctx: distributed.DistContext | None
                 ) -> float:
    """Mean loss of the steps since the last log, over every rank's batches (called at
    the same steps on all ranks: the log and checkpoint steps)."""
    total, n = distributed.all_sum([float(torch.stack(window).float().sum()), len(window)],
                                   dist_ctx)
    return total / n


def _loop(model, trainer: Trainer, make, start: int, total: int, run: dict, log_every: int,
          prefetch: bool, progress: bool, save, save_every: int, should_stop=None,
          on_progress=None, dist_ctx: distributed.DistContext | None = None) -> None:
    from tqdm import tqdm

    bar = tqdm(total=total, initial=start, unit="step", file=sys.stderr, disable=not progress,
               dynamic_ncols=True, desc="pretrain")
    pool = ThreadPoolExecutor(max_workers=1) if prefetch else None
    pending = pool.submit(make, start) if pool and start < total else None
    window: list[torch.Tensor] = []
    t0, tokens0 = time.perf_counter(), run["tokens_seen"]
    try:
        for step in range(start, total):
            if should_stop is not None and distributed.any_rank(should_stop(), dist_ctx):
                raise TrainingCancelled("pretraining cancelled")
            if pool:
                assert pending is not None  # submitted for every step below total
                batch = pending.result()
                pending = pool.submit(make, step + 1) if step + 1 < total else None
            else:
                batch = make(step)
            window.append(trainer.step(batch_to_device(batch, trainer.device)))
            run["tokens_seen"] += batch.n_tokens
            run["predictions_seen"] += int(batch.masked_pos.size)
            done = step + 1
            if done % log_every == 0 or done == total:
                loss = _window_loss(window, dist_ctx)
                run["loss_curve"].append([done, round(loss, 5)])
                window.clear()
                rate = (run["tokens_seen"] - tokens0) / max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
                if on_progress is not None:
                    on_progress(done / total, {"step": done, "total": total, "loss": loss})
            bar.update(1)
            if (save_every and done % save_every == 0) or done == total:
                if window:  # flush, so a resumed run logs exactly what an uninterrupted one does
                    run["loss_curve"].append([done, round(_window_loss(window, dist_ctx), 5)])
                    window.clear()
                run["train_seconds"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                save(done)  # under DDP, makes the counts global
                tokens0 = run["tokens_seen"]
    finally:
        bar.close()
        if pool:
            pool.shutdown(wait=True, cancel_futures=True)
