"""Offline experiments: privatize labelled text exactly as the edge does, then train on it.

The mechanisms are those of ``shared.mechanisms`` and the privatization is the edge's
own ``edge_agent.Privatizer``: the server-side code never sees the text it trains on
except here, where an operator simulates users on a public data set.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_agent import Privatizer
from models.training.data import LabelledText, dataset_from_records, label_indices
from models.versions.version_folder import BUNDLE_DIR, is_model_dir
from shared.bundle import EdgeBundle
from shared.mechanisms import registry
from shared.payload import Record

SEED_WARNING = ("warning: --seed makes the privatization noise predictable; anyone who knows "
                "the seed can remove the protection (use only for reproducible experiments)")


@dataclass
class MechanismSpec:
    """A mechanism by name and parameters (what a model's config.json stores)."""

    name: str
    params: dict
    texthide_key: int | None = None  # the client's secret mask-pool seed (never stored)


def _needing_an_encoder() -> str:
    names = [c.name for c in registry.mechanisms() if not c.payload_kind.reads_tokens]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def encoder_dim(bundle: EdgeBundle) -> int:
    """r, the sentence-vector dimension of the bundle's encoder; ValueError if it has none."""
    desc = bundle.meta.get("encoder")
    if bundle.encoder_onnx is None or not desc:
        raise ValueError(f"bundle {bundle.bundle_id[:12]}… has no encoder.onnx: "
                         f"{_needing_an_encoder()} need one (cloud-api export-bundle --out "
                         "DIR, then --bundle DIR)")
    return int(desc["output_dim"])


def build_mechanism(name: str, bundle: EdgeBundle, *, texthide_key: int | None = None,
                    **settings):
    """The ``shared.mechanisms`` object for ``name`` from the command line's settings: one
    per parameter of the mechanism's ``Params`` (``models.cli.flags.mechanism_settings``;
    others are ignored), a setting that is None or absent taking the parameter's default;
    ValueError names a missing or invalid parameter."""
    cls = registry.get(name)
    fields = cls.Params.model_fields
    params = {}
    for p in cls.param_names():
        value = settings.get(p)
        if value is None and not fields[p].is_required():
            value = fields[p].get_default(call_default_factory=True)
        if value is not None or p in settings:
            params[p] = value
    return mechanism_from_params(name, params, bundle, texthide_key=texthide_key)


def mechanism_from_params(name: str, params: dict, bundle: EdgeBundle,
                          texthide_key: int | None = None, texthide_k: int | None = None):
    """Rebuild the mechanism a model was trained with (from its config.json), with the one
    factory (``shared.mechanisms.create``); ``texthide_k`` overrides TextHide's k (k = 1 to
    evaluate)."""
    cls = registry.get(name)
    p = dict(params)
    if texthide_k and "k" in p:
        p["k"] = texthide_k
    if "texthide_key" in cls.edge_options and texthide_key is None:
        raise ValueError(f"{name} needs --texthide-key (the client's secret mask pool seed; "
                         "the same key is needed to evaluate)")
    try:
        return cls.from_params(p, bundle, secret=texthide_key)
    except registry.MissingParameter as exc:
        raise ValueError(f"{name} needs --{exc.param.replace('_', '-')}") from None
    except registry.NoEncoder:
        encoder_dim(bundle)  # the message of this surface
        raise


def load_bundle(bundle_dir: str | os.PathLike | None = None,
                model_dir: str | os.PathLike | None = None,
                expected_id: str | None = None, table: str | None = None,
                version_dir: str | os.PathLike | None = None) -> EdgeBundle:
    """A saved bundle (``bundle_dir``), else the one a model version carries
    (``version_dir``/bundle, written by ``cloud-api train --table``), else the bundle of a
    BERT folder (None = MiniLM), with the privatization ``table`` (``shared.table``: e.g.
    ``pca32-int8``; None = the model's own embeddings).

    ``model_dir`` may also be a privbert model version or a pretraining checkpoint: the
    bundle is read from the BERT folder named by ``base_model`` in its config when it has
    no word embeddings of its own. ValueError if the id is not ``expected_id``.
    """
    if bundle_dir is not None and table is not None:
        raise ValueError("--table builds a bundle and --bundle reads one: pass one of them")
    if bundle_dir is None and version_dir is not None and table is None:
        bundle_dir = model_bundle_dir(version_dir, expected_id)
    if bundle_dir is not None:
        bundle = EdgeBundle.load(bundle_dir)
    else:
        bundle = EdgeBundle.from_model(_bert_dir_for_bundle(model_dir), table=table)
    if expected_id is not None and bundle.bundle_id != expected_id:
        raise ValueError(f"the bundle {bundle.bundle_id[:12]}… is not the model's "
                         f"{expected_id[:12]}… (pass the bundle it was trained with: --bundle)")
    return bundle


def model_bundle_dir(version_dir: str | os.PathLike, bundle_id: str | None) -> Path | None:
    """Where a model version's own bundle is: its ``bundle/`` folder (``cloud-api train``
    writes one for a designed table or a token policy), else ``bundles/<bundle_id>`` of the
    ``$PRIVBERT_HOME`` that holds the version (``models/<id>/versions/<v>``: what
    ``cloud-api bootstrap`` and the job worker register); None if neither has it."""
    v = Path(version_dir)
    if (v / BUNDLE_DIR / "bundle.json").is_file():
        return v / BUNDLE_DIR
    if bundle_id is None:
        return None
    for home in v.resolve().parents[:4]:
        cand = home / "bundles" / bundle_id
        if (cand / "bundle.json").is_file():
            return cand
    return None


def _bert_dir_for_bundle(model_dir) -> Path | None:
    if model_dir is None:
        return None
    p = Path(model_dir)
    if not p.is_dir():
        raise ValueError(f"{p}: no such model folder")

    if is_model_dir(p):
        raise ValueError(f"{p} is a trained model, not a BERT folder: pass --bundle")
    return p


def make_privatizer(bundle: EdgeBundle, mechanism, max_length: int | None = None,
                    allow_weak_privacy: bool = False):
    """The edge's Privatizer, with ``max_length`` capped by the bundle/encoder limit (and the
    privacy floor's opt-out passed on)."""
    if max_length is not None:
        limit = bundle.max_length
        enc = bundle.meta.get("encoder") or {}
        if enc.get("max_length"):
            limit = min(limit, int(enc["max_length"]))
        max_length = min(max_length, limit)
    # the server's own bundle: trusted as it is (the text floor of issue 42 protects a device
    # from a server's bundle; here the server privatizes its training text with its own)
    return Privatizer(bundle, mechanism, max_length=max_length, truncate="first",
                      allow_weak_privacy=allow_weak_privacy,
                      trusted_bundles=frozenset({bundle.bundle_id}))


def privatize_labelled(data: LabelledText, label_names: list[str], privatizer,
                       rng: np.random.Generator | None = None, chunk: int = 256,
                       progress: bool = True, desc: str = "privatize") -> list[Record]:
    """Records for every text of ``data`` (labels as class indices of ``label_names``).

    Texts without any word piece are skipped (counted in ``data.skipped_empty``). TextHide
    with k > 1 mixes within each chunk of ``chunk`` examples; the labels become soft.
    """
    return PublicText(data, label_names, privatizer).records(rng, chunk, progress, desc)


def chunk_indices(items: list[int], size: int, at_least: int) -> list[list[int]]:
    """Consecutive chunks of ``size``; a last chunk smaller than ``at_least`` (TextHide's k)
    joins the one before it."""
    out = [items[s: s + size] for s in range(0, len(items), size)]
    if len(out) > 1 and len(out[-1]) < at_least:
        out[-2] += out.pop()
    return out


class PublicText:
    """Labelled public text, tokenized once as the edge does and privatized on request.

    The server holds such text only when an operator trains on a public data set
    (``cloud-api bootstrap`` / ``train`` from a TSV); it is never a user's. What it allows
    that device records do not: fresh noise every epoch, the original ids (denoising loss)
    and the text itself (a teacher for distillation).
    """

    def __init__(self, data: LabelledText, label_names: list[str], privatizer):
        self.privatizer = privatizer
        self.label_names = list(label_names)
        y = label_indices(data.labels, label_names)
        items = privatizer.tokenize(data.texts, data.pairs, allow_empty=True)
        keep = [i for i, it in enumerate(items) if it is not None]
        data.skipped_empty += len(items) - len(keep)
        if not keep:
            raise ValueError("empty data set: no text has any token")
        self.items = [items[i] for i in keep]
        self.labels = [y[i] for i in keep]

    def __len__(self) -> int:
        return len(self.items)

    def originals(self) -> list[np.ndarray]:
        """The word-piece ids of each kept text (pairs: a then b), as privatized."""
        return [it.ids_a if it.ids_b is None else np.concatenate([it.ids_a, it.ids_b])
                for it in self.items]

    def records(self, rng: np.random.Generator | None = None, chunk: int = 256,
                progress: bool = True, desc: str = "privatize") -> list[Record]:
        """One record per kept text, privatized afresh (TextHide k > 1 mixes per chunk)."""
        from tqdm.auto import tqdm

        out: list[Record] = []
        idxs = chunk_indices(list(range(len(self.items))), chunk,
                             getattr(self.privatizer.mechanism, "k", 1))
        with tqdm(total=len(self.items), disable=not progress, unit="text", desc=desc,
                  mininterval=1.0, file=sys.stderr) as bar:
            for idx in idxs:
                out += self.privatizer.records_tokenized(
                    [self.items[i] for i in idx], [self.labels[i] for i in idx],
                    num_labels=len(self.label_names), rng=rng)
                bar.update(len(idx))
        return out

    def dataset(self, rng: np.random.Generator | None = None, *, originals: bool = False,
                progress: bool = True, desc: str = "privatize", where: str = "public text"):
        """A ``models.training.data.PayloadDataset`` of a fresh privatization; ``originals``: with
        the original ids in ``extra["originals"]`` (token mechanisms only)."""
        ds = dataset_from_records(self.records(rng, progress=progress, desc=desc),
                                  self.label_names, where=where)
        if originals:
            if ds.kind == "vector":
                raise ValueError(f"{ds.mechanism} payloads have no tokens to denoise")
            ds.extra["originals"] = self.originals()
        return ds
