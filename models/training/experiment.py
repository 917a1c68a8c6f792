"""Library entry points: train a model version from records or a labelled TSV, evaluate it.

These are what ``cloud-api train`` / ``evaluate``, the retraining worker and the
benchmarks call::

    from models.training.experiment import train_from_tsv, evaluate_tsv
    res = train_from_tsv("train.tsv", "var/m1", "dchi-text", params={"eta": 65},
                         dev_tsv="dev.tsv", limit=20000)
    print(evaluate_tsv(res.model_dir, "dev.tsv")["accuracy"])

Every check of the inputs (files, columns, labels, bundle, base checkpoint, output
folder) runs before any training starts.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.attacks.denoiser_train import read_corpus
from models.nets.backbone import autocast_dtype, check_same_bundle, keep_layers, pick_device
from models.pretraining.pretrain import INFO_FILE
from models.training.data import (
    PayloadDataset,
    dataset_from_records,
    kind_of,
    label_indices,
    label_names_from,
    read_labelled_tsv,
)
from models.training.finetune import (
    TrainConfig,
    build_model,
    check_compatible,
    config_dict,
    evaluate_dataset,
    finetune,
)
from models.training.levers import (
    check_teacher,
    get_teacher,
    public_denoiser,
    public_posterior,
    warm_start,
)
from models.training.posterior import POSTERIOR_FILE, ChannelPosterior
from models.training.privatize import (
    PublicText,
    build_mechanism,
    load_bundle,
    make_privatizer,
    mechanism_from_params,
)
from models.training.recipe import Recipe
from models.versions.model_version import check_out_dir, load_model, save_model_version
from models.versions.version_folder import is_model_dir, read_config
from models.versions.version_module import load_backbone
from shared.bundle import EdgeBundle
from shared.mechanisms import registry
from shared.payload import Record


@dataclass
class TrainResult:
    model_dir: Path
    metrics: dict
    n_train: int
    n_dev: int
    fingerprint: str


def _as_bundle(bundle: EdgeBundle | str | os.PathLike | None, base=None) -> EdgeBundle:
    if isinstance(bundle, EdgeBundle):
        return bundle
    if bundle is not None:
        return load_bundle(bundle_dir=bundle)

    if base is not None and not Path(base).is_dir():
        raise ValueError(f"{base}: no such BERT folder")
    if base is not None and is_model_dir(base):
        raise ValueError(f"{base} is a trained model: pass the bundle it was trained with "
                         "(--bundle)")
    if base is not None and not (Path(base) / "vocab.txt").is_file() and not (
            Path(base) / "tokenizer.json").is_file():
        raise ValueError(f"{base}: has no tokenizer to build the bundle from; pass --bundle")
    return load_bundle(model_dir=base)


def _guarantee(name: str, params: dict, bundle: EdgeBundle, feature_dim: int) -> dict:
    """The published and worst-case guarantee of the training payloads (shared.accounting).
    Vector kinds take their dimension from the payloads (no encoder or secret needed: the
    accounting of TextHide reads (m, k) only, any mask pool will do)."""
    cls = registry.get(name)
    if cls.payload_kind.reads_tokens:
        return mechanism_from_params(name, params, bundle).guarantee(bundle)
    dim = feature_dim // cls.values_per_dim(params)
    return cls.from_params(params, dim=dim, secret=0).guarantee(dim=dim)


def train_from_records(records: Sequence[Record | tuple], out_dir: str | os.PathLike, *,
                       bundle: EdgeBundle | str | os.PathLike | None = None,
                       dev_records: Sequence[Record | tuple] | None = None,
                       base: str | os.PathLike | None = None, cfg: TrainConfig | None = None,
                       label_names: Sequence[str] | None = None, extra_config: dict | None = None,
                       should_stop: Callable[[], bool] | None = None,
                       on_progress: Callable[[float, dict], None] | None = None,
                       overwrite: bool = False, dist_ctx=None,
                       recipe: Recipe | None = None,
                       posterior: ChannelPosterior | None = None,
                       denoiser=None) -> TrainResult:
    """Fine-tune on privatized records (edge JSONL or the record store) and write a model
    version folder ``out_dir``. ``dist_ctx`` (``models.training.distributed``, under torchrun):
    DDP; only rank 0 writes the folder.

    ``recipe``: device records have no raw text, so only its ``posterior`` and ``denoiser``
    apply (the others are refused); the table is ``posterior`` (e.g. the base version's
    ``posterior.npz``), the denoiser ``denoiser`` (``models.attacks.denoiser.Denoiser``, e.g. the
    base version's, trained on public text), both checked against the records' mechanism,
    η and bundle.
    """
    cfg = cfg or TrainConfig()
    cfg.validate()
    recipe = recipe or Recipe()
    check_out_dir(out_dir, overwrite)
    bundle = _as_bundle(bundle, base)
    train = dataset_from_records(records, label_names, where="training records")
    recipe.check(train.mechanism, raw_text=False)
    if recipe.posterior and posterior is None:
        raise ValueError("the recipe asks for channel-posterior inputs but no posterior table "
                         "was given (device records cannot build one: it comes from public "
                         "text, e.g. the base version's posterior.npz)")
    if not recipe.posterior:
        posterior = None
    if recipe.denoiser and denoiser is None:
        raise ValueError("the recipe asks for a contextual denoiser but none was given "
                         "(device records cannot train one: it comes from public text, e.g. "
                         "the base version's denoiser.safetensors)")
    if not recipe.denoiser:
        denoiser = None
    dev = (dataset_from_records(dev_records, train.label_names, where="dev records")
           if dev_records else None)
    return _train(train, dev, out_dir, bundle, base, cfg, extra_config, should_stop,
                  on_progress, overwrite, dist_ctx, recipe=recipe, posterior=posterior,
                  denoiser=denoiser)


def base_pretraining(base, mechanism: str, params: dict) -> dict | None:
    """What a privacy-adaptive pretraining checkpoint was trained on (its pretrain.json),
    with ``matches``: same mechanism and η as the task (Qu et al. §3.4 pretrain with the
    task's privatization); None for a base that is not such a checkpoint."""
    import json

    if base is None or not (Path(base) / INFO_FILE).is_file():
        return None
    try:
        info = json.loads((Path(base) / INFO_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    out = {k: info.get(k) for k in ("objective", "mechanism", "eta", "steps")}
    eta = params.get("eta")
    out["matches"] = bool(out["mechanism"] == mechanism and eta is not None
                          and out["eta"] is not None
                          and abs(float(out["eta"]) - float(eta)) <= 1e-9 * abs(float(eta)))
    return out


def _train(train: PayloadDataset, dev: PayloadDataset | None, out_dir, bundle: EdgeBundle,
           base, cfg: TrainConfig, extra_config: dict | None, should_stop, on_progress,
           overwrite: bool, dist_ctx=None, *, recipe: Recipe | None = None,
           posterior: ChannelPosterior | None = None, refresh=None,
           teacher_module=None, denoiser=None) -> TrainResult:
    check_compatible(train, dev, bundle)
    recipe = recipe or Recipe()
    if base is not None and train.kind == "vector":
        raise ValueError(f"--base does not apply to {train.mechanism}: its classifier is an "
                         "MLP over the sentence vector, not a BERT")
    pre = base_pretraining(base, train.mechanism, train.params)
    if pre is not None and not pre["matches"]:
        import sys

        print(f"warning: {base} was pretrained with {pre['mechanism']} eta={pre['eta']}, the "
              f"task uses {train.mechanism} {train.params}; Qu et al. §3.4 pretrain with the "
              "task's own privatization", file=sys.stderr)
    # checks the base against the bundle, and the posterior against the payloads
    model = build_model(train, bundle, base, cfg, posterior=posterior, denoiser=denoiser)
    if recipe.warm_start:

        warm_start(model, teacher_module)
    cfg = dataclasses.replace(cfg, denoise=recipe.denoise, denoise_rate=recipe.denoise_rate,
                              distill=recipe.distill,
                              distill_temperature=recipe.distill_temperature,
                              ema=recipe.ema, rtd=recipe.rtd)
    result = finetune(train, dev, bundle, base, cfg, should_stop, on_progress, model=model,
                      dist_ctx=dist_ctx, refresh=refresh)
    if dist_ctx is not None and not dist_ctx.is_main:  # rank 0 writes the version
        return TrainResult(Path(out_dir), result.metrics, len(train), len(dev) if dev else 0,
                           train.fingerprint)
    import torch
    import transformers

    config = {
        "kind": train.kind, "mechanism": train.mechanism, "params": train.params,
        "bundle_id": bundle.bundle_id, "special_ids": bundle.special_ids,
        "labels": train.label_names, "max_length": cfg.max_length,
        "base_model": None if train.kind == "vector" else str(base or "default MiniLM-L6-H384"),
        "pretraining": pre,
        "pooling": cfg.pooling if train.kind != "vector" else None,
        "guarantee": _guarantee(train.mechanism, train.params, bundle, train.feature_dim()),
        "recipe": recipe.as_dict(),
        "posterior": None if posterior is None else {"file": POSTERIOR_FILE,
                                                     **posterior.describe()},
        "denoiser": None if denoiser is None else denoiser.describe(),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        **(extra_config or {}),
    }
    data_info = {"train_fingerprint": train.fingerprint, "train_examples": len(train),
                 "train_soft_labels": train.n_soft,
                 "train_label_counts": _label_counts(train),
                 "dev_fingerprint": dev.fingerprint if dev is not None else None,
                 "dev_examples": len(dev) if dev is not None else 0,
                 "train_config": config_dict(cfg)}
    files = {} if posterior is None else {POSTERIOR_FILE: posterior.to_bytes()}
    path = save_model_version(out_dir, result.module, config, result.metrics, data_info,
                              overwrite, extra_files=files)
    return TrainResult(path, result.metrics, len(train), len(dev) if dev else 0,
                       train.fingerprint)


def _label_counts(ds: PayloadDataset) -> dict[str, float]:
    if ds.soft:
        sums = ds.targets.sum(axis=0)
        return {n: float(v) for n, v in zip(ds.label_names, sums, strict=True)}
    counts = np.bincount(ds.targets, minlength=len(ds.label_names))
    return {n: int(c) for n, c in zip(ds.label_names, counts, strict=True)}


def train_from_tsv(train_tsv: str | os.PathLike, out_dir: str | os.PathLike,
                   mechanism: str, params: dict | None = None, *,
                   dev_tsv: str | os.PathLike | None = None,
                   bundle: EdgeBundle | str | os.PathLike | None = None,
                   base: str | os.PathLike | None = None, cfg: TrainConfig | None = None,
                   limit: int | None = None, dev_limit: int | None = None,
                   rng: np.random.Generator | None = None, overwrite: bool = False,
                   progress: bool | None = None,
                   allow_weak_privacy: bool = False, recipe: Recipe | None = None,
                   teacher: str | os.PathLike | None = None,
                   posterior: ChannelPosterior | None = None,
                   posterior_cache: str | os.PathLike | None = None,
                   denoiser=None) -> TrainResult:
    """Privatize a labelled TSV with the edge's Privatizer and fine-tune on it.

    ``params``: the mechanism's arguments as for :func:`models.training.privatize.build_mechanism`
    (``eta``; ``epsilon``, ``calibration``, ``word_dropout``; ``lam``; ``m``, ``k``,
    ``texthide_key``). ``rng`` None = fresh OS entropy for the privatization.
    Parameters weaker than the privacy floor (``shared.floor``) raise WeakPrivacyError
    before any work unless ``allow_weak_privacy``; the model's config then records why.
    ``recipe`` (``models.training.recipe``; None: none of its levers): the text is public, so every
    lever applies. ``teacher``: a model version that reads plain ids (mechanism ``none``)
    for ``recipe.distill`` / ``warm_start``; None trains one on the same text first (one
    epoch).
    ``posterior``: a prebuilt table for ``recipe.posterior``, else built from the training
    text (kept in ``posterior_cache`` by its inputs' digest when given).
    ``denoiser``: a trained ``models.attacks.denoiser.Denoiser`` for ``recipe.denoiser``, else one is
    trained on the training text (and ``recipe.denoiser_corpus``), cached the same way.
    """
    cfg = cfg or TrainConfig()
    cfg.validate()
    recipe = recipe or Recipe()
    recipe.check(mechanism, raw_text=True)
    progress = cfg.progress if progress is None else progress
    check_out_dir(out_dir, overwrite)
    data = read_labelled_tsv(train_tsv, limit)
    if not len(data):
        raise ValueError(f"{train_tsv}: empty data set (no labelled rows)")
    dev_data = read_labelled_tsv(dev_tsv, dev_limit) if dev_tsv is not None else None
    if dev_data is not None and not len(dev_data):
        raise ValueError(f"{dev_tsv}: empty data set (no labelled rows)")
    names = label_names_from(data.labels)
    if len(names) < 2:
        raise ValueError(f"{train_tsv}: a classifier needs at least 2 labels, found {names}")
    if dev_data is not None:

        label_indices(dev_data.labels, names)  # unknown dev labels: error now
        if (dev_data.pairs is None) != (data.pairs is None):
            raise ValueError(f"{dev_tsv}: sentence pairs in one file, single sentences in "
                             "the other")
    bundle = _as_bundle(bundle, base)
    p = dict(params or {})
    mech = build_mechanism(mechanism, bundle, **p)
    # the edge's Privatizer checks the privacy floor (WeakPrivacyError) before any work
    privatizer = make_privatizer(bundle, mech, cfg.max_length, allow_weak_privacy)
    weak = privatizer.weak_privacy
    # the backbone, teacher and posterior are checked before the (slow) privatization
    _check_base(mechanism, bundle, base, cfg)
    if (recipe.distill or recipe.warm_start) and teacher is not None:
        check_teacher(teacher, bundle, names)
    if posterior is not None:
        posterior.check_for(mechanism, mech.params, bundle.bundle_id)
    if denoiser is not None:
        denoiser.check_for(mechanism, mech.params, bundle.bundle_id)
    corpus = []
    if recipe.denoiser and denoiser is None and recipe.denoiser_corpus:

        corpus = read_corpus(recipe.denoiser_corpus)
    public = PublicText(data, names, privatizer)
    train = public.dataset(rng, originals=recipe.denoise > 0 or recipe.rtd > 0, progress=progress,
                           desc="privatize train", where=str(train_tsv))
    dev = None
    if dev_data is not None:
        dev_priv = privatizer
        if mech.mixes:  # predictions hide one input each (TextHide: k = 1)
            dev_priv = make_privatizer(bundle, build_mechanism(
                mechanism, bundle, **type(mech).prediction_params(p)), cfg.max_length,
                allow_weak_privacy)
        dev = PublicText(dev_data, names, dev_priv).dataset(
            rng, progress=progress, desc="privatize dev", where=str(dev_tsv))
    if (recipe.posterior or (recipe.denoiser and denoiser is None)) and posterior is None:
        posterior = public_posterior(bundle, mechanism, mech.params, data.texts, recipe, rng,
                                     posterior_cache, progress)
    if recipe.denoiser and denoiser is None:

        assert posterior is not None  # built just above for the denoiser's bias
        denoiser = public_denoiser(bundle, posterior, data.texts + corpus, recipe, base, rng,
                                   posterior_cache, progress)
    if not recipe.posterior:
        posterior = None  # built for the denoiser's bias only
    teacher_module = None
    if recipe.distill or recipe.warm_start:
        teacher_module, probs = get_teacher(public, bundle, teacher, base, cfg)
        if recipe.distill:
            train.extra["teacher_probs"] = probs
    if recipe.fresh_noise and cfg.epochs == 1:  # nothing to refresh: recorded as not used
        recipe = dataclasses.replace(recipe, fresh_noise=False)
    refresh = None
    if recipe.fresh_noise:
        def refresh(epoch: int) -> PayloadDataset:
            ds = public.dataset(rng, originals=recipe.denoise > 0 or recipe.rtd > 0, progress=False,
                                where=str(train_tsv))
            ds.extra.update({k: v for k, v in train.extra.items() if k == "teacher_probs"})
            return ds
    extra = {"source": {"train_rows": len(data), "skipped_empty": data.skipped_empty,
                        "pairs": data.pairs is not None}}
    if weak is not None:  # trained with --allow-weak-privacy: say so next to the guarantee
        extra["weak_privacy"] = weak
    return _train(train, dev, out_dir, bundle, base, cfg, extra, None, None, overwrite,
                  recipe=recipe, posterior=posterior, refresh=refresh,
                  teacher_module=teacher_module, denoiser=denoiser)


def _check_base(mechanism: str, bundle: EdgeBundle, base, cfg: TrainConfig) -> None:
    if kind_of(mechanism) == "vector":
        for flag, value in (("--base", base), ("--layers", cfg.layers)):
            if value is not None:
                raise ValueError(f"{flag} does not apply to {mechanism}: its classifier is an "
                                 "MLP over the sentence vector, not a BERT")
        return

    bert = load_backbone(base)
    check_same_bundle(bert, bundle)
    if cfg.layers is not None:
        keep_layers(bert, cfg.layers)  # more layers than the base has: an error now


# -- evaluation ------------------------------------------------------------------------------
def evaluate_records(model_dir: str | os.PathLike, records: Sequence[Record | tuple], *,
                     device: str = "auto", precision: str = "auto",
                     batch_size: int = 128) -> dict:
    """Accuracy and per-class figures of a model version on privatized labelled records."""
    mv = load_model(model_dir)
    ds = dataset_from_records(records, mv.labels, where="evaluation records")
    if ds.bundle_id != mv.bundle_id or ds.mechanism != mv.mechanism:
        raise ValueError(f"records are {ds.mechanism}/{ds.bundle_id[:12]}…, the model "
                         f"{mv.mechanism}/{mv.bundle_id[:12]}…")
    for r in records[:1]:
        mv.check_payload(r.payload if isinstance(r, Record) else r[0])
    dev = pick_device(device)
    mv.module.to(dev)
    return evaluate_dataset(mv.module, ds, mv.special_ids, mv.max_length, dev,
                            autocast_dtype(dev, precision), batch_size)


def evaluate_tsv(model_dir: str | os.PathLike, tsv: str | os.PathLike, *,
                 bundle: EdgeBundle | str | os.PathLike | None = None,
                 rng: np.random.Generator | None = None, limit: int | None = None,
                 texthide_key: int | None = None, device: str = "auto",
                 precision: str = "auto", progress: bool = True) -> dict:
    """Privatize a labelled TSV as the model's mechanism does (TextHide: k = 1, with the
    client's ``texthide_key``) and evaluate; labels unknown to the model are an error."""

    cfg = read_config(model_dir)
    data = read_labelled_tsv(tsv, limit)
    if not len(data):
        raise ValueError(f"{tsv}: empty data set (no labelled rows)")
    label_indices(data.labels, cfg["labels"])
    pairs = (cfg.get("source") or {}).get("pairs")
    if pairs is not None and pairs != (data.pairs is not None):
        raise ValueError(f"{tsv}: {'single sentences' if pairs is False else 'sentence pairs'}"
                         f", but the model was trained on "
                         f"{'sentence pairs' if pairs else 'single sentences'}")
    if isinstance(bundle, EdgeBundle):
        if bundle.bundle_id != cfg["bundle_id"]:
            raise ValueError(f"the bundle {bundle.bundle_id[:12]}… is not the model's "
                             f"{cfg['bundle_id'][:12]}…")
    elif bundle is not None:
        bundle = load_bundle(bundle_dir=bundle, expected_id=cfg["bundle_id"])
    else:
        base = cfg.get("base_model")
        base = None if base in (None, "default MiniLM-L6-H384") else base
        bundle = load_bundle(model_dir=base, expected_id=cfg["bundle_id"],
                             version_dir=model_dir)
    mech = mechanism_from_params(cfg["mechanism"], cfg["params"], bundle, texthide_key,
                                 texthide_k=1)
    # a model trained with --allow-weak-privacy is evaluated the way it was trained
    privatizer = make_privatizer(bundle, mech, int(cfg["max_length"]),
                             bool(cfg.get("weak_privacy")))
    records = PublicText(data, cfg["labels"], privatizer).records(rng, progress=progress,
                                                                  desc="privatize test")
    report = evaluate_records(model_dir, records, device=device, precision=precision)
    report["skipped_empty"] = data.skipped_empty
    return report
