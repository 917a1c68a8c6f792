"""A model version's classifier with its weights, and the BERT a model starts from.

:func:`load_classifier` is the part of ``models.versions.model_version.load_model`` that needs only the
folder's config and weights (``load_model`` then attaches a contextual denoiser and wraps
the result); :func:`load_backbone` takes the BERT of a BERT folder, a pretraining checkpoint
or a model version. Neither imports ``models.attacks.denoiser``, which builds a new denoiser on such
a BERT: so ``models.attacks.denoiser`` and ``models.versions.model_version`` never import each other in a circle.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import nn

from models.nets.backbone import load_bert
from models.nets.classifiers import classifier_from_architecture
from models.versions.manifest import verify_folder
from models.versions.version_folder import WEIGHTS_FILE, is_model_dir, read_config


def load_classifier(path: str | os.PathLike, verify: bool = True) -> tuple[dict, nn.Module]:
    """(config, classifier module with the folder's weights) of a model version folder; with
    ``verify``, first checked whole (``models.versions.manifest.verify_folder``: IntegrityError, a
    ValueError). ValueError when the weights do not fit the architecture."""
    from safetensors.torch import load_file

    p = Path(path)
    if verify:
        verify_folder(p, digest_unsealed=False)
    cfg = read_config(p)
    if not (p / WEIGHTS_FILE).is_file():
        raise ValueError(f"{p}: no {WEIGHTS_FILE}")
    module = classifier_from_architecture(cfg["architecture"])
    state = load_file(str(p / WEIGHTS_FILE))
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"{p / WEIGHTS_FILE}: weights do not fit the architecture "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return cfg, module


def load_backbone(base: str | os.PathLike | None):
    """A BertModel from a BERT folder (None = MiniLM), a pretraining checkpoint folder, or
    a privbert model version (its BERT)."""
    if base is not None and is_model_dir(base):
        cfg, module = load_classifier(base)
        bert = getattr(module, "bert", None)
        if bert is None:
            raise ValueError(f"{base}: a {cfg['mechanism']} model has no BERT to start from")
        return bert.eval()
    if base is not None and not Path(base).is_dir():
        raise ValueError(f"{base}: no such BERT folder")
    return load_bert(base)
