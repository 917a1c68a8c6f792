"""The levers of the training recipe that need more than the payloads (``models.training.recipe``):
the channel posterior built from public text, and the teacher that reads that text.

Both run on the server, on public text an operator trains on (``cloud-api bootstrap`` /
``train --data``); neither ever sees a user's text.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

from models.attacks.denoiser_train import DenoiserConfig
from models.attacks.denoiser_train import public_denoiser as cached
from models.training.finetune import finetune, predict_dataset
from models.training.posterior import ChannelPosterior, build_posterior
from models.training.privatize import PublicText, make_privatizer
from models.training.recipe import Recipe
from models.versions.model_version import load_model
from models.versions.version_folder import read_config
from shared.bundle import EdgeBundle
from shared.mechanisms import NoPrivacy, registry


def public_posterior(bundle: EdgeBundle, mechanism: str, params: dict, texts: list[str],
                     recipe: Recipe, rng: np.random.Generator | None = None,
                     cache: str | os.PathLike | None = None,
                     progress: bool = False) -> ChannelPosterior:
    """The channel posterior of the mechanism from public ``texts`` (``models.training.posterior``),
    read from / written to ``cache`` (a folder) under a digest of everything it depends on."""
    key = hashlib.sha256(json.dumps(
        {"bundle": bundle.bundle_id, "mechanism": mechanism, "eta": params.get("eta"),
         **({"public_p": params["public_p"]} if params.get("public_p") is not None else {}),
         "passes": recipe.posterior_passes, "min_draws": recipe.posterior_min_draws,
         "texts": hashlib.sha256("\n".join(texts).encode()).hexdigest()},
        sort_keys=True).encode()).hexdigest()[:20]
    path = Path(cache) / f"{mechanism}-{key}.npz" if cache is not None else None
    if path is not None and path.is_file():
        try:
            table = ChannelPosterior.load(path)
            table.check_for(mechanism, params, bundle.bundle_id)
            return table
        except ValueError:
            pass  # unreadable or for something else: build it again
    bar = _Progress(progress, "posterior")
    table = build_posterior(bundle, mechanism, float(params["eta"]), texts,
                            passes=recipe.posterior_passes,
                            min_draws=recipe.posterior_min_draws, rng=rng,
                            source={"digest": key}, on_progress=bar.update,
                            public_p=params.get("public_p"))
    bar.close()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        table.save(path)
    return table


def public_denoiser(bundle: EdgeBundle, posterior: ChannelPosterior, texts: list[str],
                    recipe: Recipe, base=None, rng: np.random.Generator | None = None,
                    cache: str | os.PathLike | None = None, progress: bool = False):
    """The contextual denoiser of ``recipe`` (``models.attacks.denoiser``) trained on the public
    ``texts`` over ``posterior``'s bias, read from / written to ``cache`` by its inputs'
    digest."""

    cfg = DenoiserConfig(layers=recipe.denoiser_layers, candidates=recipe.denoiser_candidates,
                         epochs=recipe.denoiser_epochs, progress=progress)
    return cached(bundle, posterior, texts, cfg, base=base, rng=rng, cache=cache,
                  log=None if progress else (lambda m: None))


class _Progress:
    """A tqdm bar fed (done, total) pairs."""

    def __init__(self, enabled: bool, desc: str):
        from tqdm.auto import tqdm

        self.bar = tqdm(disable=not enabled, unit="run", desc=desc, mininterval=1.0,
                        file=sys.stderr)

    def update(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def check_teacher(teacher, bundle: EdgeBundle, names: list[str]) -> None:
    cfg = read_config(teacher)
    if registry.get(cfg["mechanism"]).private:
        raise ValueError(f"{teacher}: a teacher must read the original text (mechanism none),"
                         f" not {cfg['mechanism']}")
    if cfg["bundle_id"] != bundle.bundle_id:
        raise ValueError(f"{teacher}: the teacher was trained for bundle "
                         f"{cfg['bundle_id'][:12]}…, not {bundle.bundle_id[:12]}…")
    if list(cfg["labels"]) != list(names):
        raise ValueError(f"{teacher}: the teacher's labels {cfg['labels']} are not {names}")


def plain_dataset(public: PublicText, bundle: EdgeBundle, max_length: int):
    """``public``'s texts as plain ids (mechanism none): what the teacher reads."""
    plain = PublicText.__new__(PublicText)  # the same tokenized items, no privatization
    plain.privatizer = make_privatizer(bundle, NoPrivacy(), max_length)
    plain.label_names, plain.items, plain.labels = (public.label_names, public.items,
                                                    public.labels)
    return plain.dataset(None, progress=False, where="teacher input")


def get_teacher(public: PublicText, bundle: EdgeBundle, teacher, base, cfg):
    """(teacher module, its probabilities (N, C) on ``public``'s original texts): the model
    version ``teacher`` (mechanism none), else one fine-tuned here for one epoch on those
    texts from ``base`` (Hinton et al. 2015's teacher reads what the student cannot)."""
    import dataclasses


    ds = plain_dataset(public, bundle, cfg.max_length)
    if teacher is not None:
        module = load_model(teacher).module
    else:
        tcfg = dataclasses.replace(cfg, epochs=1, denoise=0.0, distill=0.0)
        module = finetune(ds, None, bundle, base, tcfg).module
    probs, _ = predict_dataset(module, ds, bundle.special_ids, cfg.max_length,
                               batch_size=cfg.eval_batch_size)
    return module, probs


def warm_start(model, teacher) -> None:
    """Start ``model`` from the teacher's weights (its BERT and head: same labels); the
    frozen word embeddings are the same bundle's, the posterior gate and table stay."""
    state = {k: v for k, v in teacher.state_dict().items()
             if not k.startswith(("posterior_", "denoiser.")) and k in model.state_dict()}
    missing = set(model.state_dict()) - set(state)
    if any(not k.startswith(("posterior_", "log_prior", "denoiser."))
           and "position_ids" not in k for k in missing):
        raise ValueError("the teacher's architecture does not match the model's "
                         f"({sorted(missing)[:3]} missing)")
    model.load_state_dict(state, strict=False)
