"""`cloud-api bootstrap`: a first served model in ``$PRIVBERT_HOME`` from a labelled TSV.

    cloud-api bootstrap --data ../shared/data/sst2/train.tsv --dev ../shared/data/sst2/dev.tsv

1. the edge bundle of the base BERT (default: the packaged MiniLM-L6-H384), with
   ``encoder.onnx`` (``models.export.writers.export_bundle``) for laplace / ome / texthide, saved into
   the home's ``bundles/`` so that ``GET /v1/bundles/{id}`` serves it;
2. the privacy floor (``shared.floor``): parameters below it are refused (exit 2) unless
   ``--allow-weak-privacy``;
3. ``models.training.experiment.train_from_tsv`` privatizes the first ``--limit`` rows as the edge
   does and fine-tunes a classifier (defaults sized to finish in minutes on 2 CPU cores);
4. with ``PRIVBERT_BACKEND=onnx``, ``classifier.onnx`` is exported into the version (what the
   onnx backend serves: the serve image);
5. the version folder is moved into the home as the model's next version and promoted;
   a running server picks it up without a restart; ``--label-names 0=negative,1=positive``
   names the TSV's labels (what predictions and records say: ``GET /v1/models``' ``labels``);
6. prints the version, its dev accuracy and the guarantee (``shared.accounting.summary``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloud_api.cli import PROG, fail, guarded, home_arg, settings_for
from cloud_api.errors import ServiceError
from cloud_api.home import ModelHome, check_id, is_id, write_atomically
from cloud_api.serving.bundles import BundleStore
from cloud_api.settings import Settings
from cloud_api.store.db import Database
from cloud_api.store.stored_home import open_home
from cloud_api.store.tasks import ensure_task
from edge_agent.param_flags import positive_int
from models.cli.flags import (
    DeviceFlags,
    MechanismFlags,
    RecipeFlags,
    add_device_args,
    add_mechanism_args,
    add_recipe_args,
    apply_policy,
    posterior_table,
    seeded_rng,
)
from models.cli.options import options_of
from models.cli.train import recipe_from_flags
from models.training.data import kind_of, label_names_from, read_labelled_tsv
from models.training.privatize import build_mechanism
from models.training.recipe import Recipe
from models.versions.manifest import update_manifest
from models.versions.version_folder import CONFIG_FILE, METRICS_FILE
from shared.accounting import summary
from shared.bundle import EdgeBundle
from shared.floor import WeakPrivacyError, require_privacy_floor
from shared.mechanisms import DChiText, registry
from shared.policy import DEFAULT_P, NO_POLICY, policy_for_new_model
from shared.table import DEFAULT_TABLE, MATCHED_ETA, matched_eta, table_for_new_model

# The quick start's defaults: at about the same compute, half of MiniLM's layers over more
# epochs of fresh noise read privatized text better than the whole model over one epoch
# (the candidates and their figures: bench/results/utility_levers.md).
DEFAULT_LIMIT = 12000
DEFAULT_DEV_LIMIT = 1000
DEFAULT_EPOCHS = 2
DEFAULT_ETA = 65.0  # on the model's own (384-d) table; a designed table has its own
DEFAULT_DEV_DRAWS = 3
DEFAULT_BERT_LR = 2e-4  # a few short epochs: 2e-5 (models' default) leaves the BERT underfit
DEFAULT_LAYERS = 3  # of the packaged MiniLM's 6 (a --base keeps all of its layers)


@dataclass(frozen=True)
class BootstrapOptions:
    """``cloud-api bootstrap``: what its flags say, parsed once."""

    data: str
    dev: str | None
    mechanism: str
    mech: MechanismFlags
    limit: int
    dev_limit: int
    dev_draws: int
    epochs: int
    lr: float | None
    batch_size: int
    max_length: int
    layers: int | None
    model_id: str | None
    task: str | None
    label_names: dict[str, str] | None
    base: str | None
    home: str | None
    if_missing: bool
    allow_weak_privacy: bool
    recipe: RecipeFlags
    compute: DeviceFlags

    @classmethod
    def parse(cls, args: argparse.Namespace) -> BootstrapOptions:
        return options_of(cls, args, mech=MechanismFlags.parse(args),
                          recipe=options_of(RecipeFlags, args), compute=DeviceFlags.parse(args))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bootstrap", help="export the bundle, train, register and promote a first model",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, metavar="TRAIN.tsv",
                   help="labelled TSV: sentence<TAB>label (or sentence_a, sentence_b, label)")
    p.add_argument("--dev", metavar="DEV.tsv", help="dev set (privatized the same way): the "
                   "dev accuracy printed at the end and the epoch kept")
    add_mechanism_args(p)
    p.set_defaults(mechanism=DChiText.name)
    p.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                   help=f"first N training rows ({DEFAULT_LIMIT}; 0 = the whole file)")
    p.add_argument("--dev-limit", type=int, default=DEFAULT_DEV_LIMIT, metavar="N",
                   help=f"first N dev rows ({DEFAULT_DEV_LIMIT}; 0 = the whole file)")
    p.add_argument("--dev-draws", type=int, default=DEFAULT_DEV_DRAWS, metavar="N",
                   help="evaluate the kept model on the dev set privatized afresh N times "
                        f"(noise the epoch choice never saw; {DEFAULT_DEV_DRAWS}; 0 = skip)")
    p.add_argument("--epochs", type=positive_int, default=DEFAULT_EPOCHS,
                   help=f"training epochs ({DEFAULT_EPOCHS})")
    p.add_argument("--lr", type=float, help=f"learning rate (default {DEFAULT_BERT_LR:g} for the "
                   "BERT classifiers; 1e-3 for the vector MLP)")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--max-length", type=positive_int, default=128)
    p.add_argument("--layers", type=positive_int, metavar="N",
                   help="keep the first N transformer layers of the base (smaller and faster "
                        f"to train and serve; default: {DEFAULT_LAYERS} of the packaged "
                        "MiniLM's 6, all of a --base)")
    p.add_argument("--model-id", metavar="ID", help="model id (default: the name of the "
                   "folder holding TRAIN.tsv, e.g. sst2, else 'default')")
    p.add_argument("--task", metavar="NAME", help="task name (default: the model id)")
    p.add_argument("--label-names", metavar="L=NAME,...", type=_label_names,
                   help="names for the TSV's labels, e.g. 0=negative,1=positive: what "
                        "predictions answer and records send (default: the labels as written)")
    p.add_argument("--base", metavar="BERT", help="BERT folder (default: the packaged "
                   "MiniLM-L6-H384)")
    home_arg(p)
    p.add_argument("--if-missing", action="store_true",
                   help="do nothing when the model already has a promoted version")
    p.add_argument("--allow-weak-privacy", action="store_true",
                   help="train even below the privacy floor (experiments only)")
    add_recipe_args(p)
    add_device_args(p)
    p.set_defaults(func=guarded(run, BootstrapOptions.parse))


LABEL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # a task's label name (store/tasks.py)


def _label_names(value: str) -> dict[str, str]:
    """``0=negative,1=positive`` as {"0": "negative", "1": "positive"}."""
    out: dict[str, str] = {}
    for part in value.split(","):
        label, sep, name = part.strip().partition("=")
        if not sep or not label or not LABEL_NAME.match(name) or label in out:
            raise argparse.ArgumentTypeError(
                f"expected LABEL=NAME pairs, e.g. 0=negative,1=positive (names of letters, "
                f"digits, '_', '.', ':', '-'), got {value!r}")
        out[label] = name
    if len(set(out.values())) != len(out):
        raise argparse.ArgumentTypeError(f"label names must be distinct, got {value!r}")
    return out


def _renamed(labels: list[str], names: dict[str, str] | None) -> list[str]:
    """The model's labels under ``--label-names`` (every label named, in the model's order)."""
    if not names:
        return labels
    missing = [lb for lb in labels if lb not in names]
    unknown = sorted(set(names) - set(labels))
    if missing or unknown:
        raise ValueError(f"--label-names must name exactly the data's labels {labels}"
                         + (f"; missing {missing}" if missing else "")
                         + (f"; not in the data: {unknown}" if unknown else ""))
    return [names[lb] for lb in labels]


def _say(message: str) -> None:
    print(f"{PROG} bootstrap: {message}", file=sys.stderr, flush=True)


def _model_id(model_id: str | None, data: str) -> str:
    if model_id:
        return check_id("model id", model_id)
    parent = Path(data).resolve().parent.name
    return parent if is_id(parent) else "default"


def run(o: BootstrapOptions) -> int:
    t0 = time.perf_counter()
    if o.limit < 0 or o.dev_limit < 0 or o.dev_draws < 0:
        return fail("--limit, --dev-limit and --dev-draws must be >= 0 (--limit 0 = the "
                    "whole file)")
    for path in (o.data, o.dev):
        if path is not None and not Path(path).is_file():
            return fail(f"{path}: no such file")
    settings = settings_for(o.home)
    home = open_home(settings).ensure()
    model_id = _model_id(o.model_id, o.data)
    task = o.task or model_id
    if o.if_missing and (v := home.promoted(model_id)):
        print(f"model={model_id} version={v} (already promoted; nothing to do)")
        _declare_task(settings, task, home.read_config(model_id, v))  # so records can be uploaded
        return 0

    m = o.mech
    o.compute.check()
    recipe = recipe_from_flags(o.recipe, o.mechanism, raw_text=True)
    params = m.settings()
    # the table a new model is trained over (shared.table.table_for_new_model)
    table = table_for_new_model(o.mechanism, m.table, m.bundle is not None or o.base is not None)
    if m.table is None and table is not None:
        _say(f"privatization table {DEFAULT_TABLE} (the default for new models: "
             "bench/results/frontier.md; --table none for the model's 384-d table)")
    bundle = _bundle(o.mechanism, m.bundle, o.base, table)
    policy = policy_for_new_model(o.mechanism, m.policy,
                                  m.bundle is not None or o.base is not None)
    if "eta" in registry.get(o.mechanism).param_names() and params["eta"] is None:
        # the dχ mechanisms: the η of this table (under this policy) matched to the 384-d
        # table at η 65; a policy not measured there: the table's own (its words outside the
        # public list get the same noise)
        name = table or "none"
        p = params.get("public_p")
        params["eta"] = (matched_eta(name, policy, DEFAULT_P if p is None else p)
                         or MATCHED_ETA.get(name, DEFAULT_ETA))
    if policy != NO_POLICY or m.policy is not None:
        bundle = apply_policy(bundle, policy, params)
        if policy != NO_POLICY:
            assert bundle.policy is not None  # apply_policy gave the bundle this policy
            _say(f"token policy {policy}: {bundle.policy.size} public words sent as typed "
                 f"with probability {1 - params['public_p']:g} (--policy none: every token "
                 "privatized)")
    weak = _check_floor(o.mechanism, bundle, params, o.allow_weak_privacy)
    if weak is not None:
        return fail(weak)

    data = read_labelled_tsv(o.data)
    rows = len(data)
    if o.label_names:  # checked before minutes of training, against the whole file

        _renamed(label_names_from(data.labels), o.label_names)
    BundleStore(home).add(bundle)
    limit = o.limit or None
    if limit is not None and limit < rows:
        _say(f"training on the first {limit:,} of {rows:,} rows of {o.data} (a subset, so "
             f"that the defaults finish in minutes on a CPU; --limit 0 for all of them)")
    else:
        _say(f"training on all {rows:,} rows of {o.data}")
    if o.dev is None:
        _say("no --dev: no dev accuracy will be measured")
    return _train_and_register(o, settings, home, model_id, task, bundle, params, rows, t0,
                               recipe)


def _bundle(mechanism: str, bundle_dir: str | None, base: str | None,
            table: str | None) -> EdgeBundle:
    """The edge bundle: --bundle DIR, else the base's (over ``table``), exported with
    encoder.onnx for the mechanisms that read a sentence vector."""

    if bundle_dir:
        if table is not None:
            raise ValueError("--table builds the bundle and --bundle reads one: pass one of "
                             "them")
        return EdgeBundle.load(bundle_dir)
    if kind_of(mechanism) != "vector":
        return EdgeBundle.from_model(base, table=table)
    if table not in (None, "none"):
        raise ValueError(f"--table is for dchi-text; {mechanism} reads a sentence vector")
    import tempfile

    # lazy: torch, only when bootstrap trains (the serve image has none)
    from models.export.writers import export_bundle

    _say("exporting the sentence encoder (encoder.onnx) into the bundle")
    with tempfile.TemporaryDirectory(prefix="privbert-bundle-") as tmp:
        out = Path(tmp) / "bundle"
        export_bundle(out, base)
        return EdgeBundle.load(out)


def _check_floor(mechanism: str, bundle: EdgeBundle, params: dict[str, Any],
                 allow_weak: bool) -> str | None:
    """None when the parameters are at or above the privacy floor (or it is waived), else
    the floor's one-line refusal."""

    mech = build_mechanism(mechanism, bundle, **params)
    try:
        reason = require_privacy_floor(mech, bundle, allow_weak=allow_weak)
    except WeakPrivacyError as exc:
        return f"{exc} (--allow-weak-privacy to train anyway, for experiments only)"
    if reason is not None:
        _say(f"warning: {reason}; --allow-weak-privacy: the payloads are close to the raw "
             "text")
    return None


def _train_and_register(o: BootstrapOptions, settings: Settings, home: ModelHome,
                        model_id: str, task: str, bundle: EdgeBundle, params: dict[str, Any],
                        rows: int, t0: float, recipe: Recipe) -> int:
    # lazy: torch, only when bootstrap trains (the serve image has none)
    from models.attacks.denoiser import Denoiser
    from models.nets.backbone import model_embeddings
    from models.training.experiment import train_from_tsv
    from models.training.finetune import TrainConfig

    lr = o.lr if o.lr is not None or kind_of(o.mechanism) == "vector" \
        else DEFAULT_BERT_LR
    cfg = TrainConfig(epochs=o.epochs, lr=lr, batch_size=o.batch_size,
                      max_length=o.max_length, pooling="mean", seed=o.mech.seed,
                      layers=_layers(o.layers, o.base, o.mechanism),
                      device=o.compute.device, precision=o.compute.precision,
                      progress=sys.stderr.isatty() and o.compute.progress)
    work = home.model_dir(model_id) / f".bootstrap-{uuid.uuid4().hex[:12]}"
    work.parent.mkdir(parents=True, exist_ok=True)
    try:
        res = train_from_tsv(o.data, work, o.mechanism, params, dev_tsv=o.dev,
                             bundle=bundle, base=o.base, cfg=cfg, limit=o.limit or None,
                             dev_limit=o.dev_limit or None, rng=seeded_rng(o.mech.seed),
                             allow_weak_privacy=o.allow_weak_privacy, recipe=recipe,
                             teacher=o.recipe.teacher,
                             posterior=(posterior_table(o.recipe.posterior_table)
                                        if o.recipe.posterior_table else None),
                             posterior_cache=home.posteriors_dir,
                             denoiser=(Denoiser.load(o.recipe.denoiser_file,
                                                     model_embeddings(bundle))
                                       if o.recipe.denoiser_file else None))
        fresh = _fresh_dev(o, res.model_dir, bundle)
        if (backend := settings.backend) in ("onnx", "onnx-int8"):
            # lazy: torch, only when bootstrap trains (the serve image has none)
            from models.export.writers import export_classifier_onnx

            _say(f"exporting classifier.onnx and classifier.int8.onnx "
                 f"(PRIVBERT_BACKEND={backend})")
            export_classifier_onnx(res.model_dir)
        config_path = res.model_dir / CONFIG_FILE
        config = json.loads(config_path.read_text())
        config["task"] = task
        config["labels"] = _renamed(list(config["labels"]), o.label_names)
        write_atomically(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n",
                         durable=False)  # the folder is not served before register's rename
        update_manifest(res.model_dir, [CONFIG_FILE])  # sealed when made: its digest now
        version = home.register(model_id, res.model_dir, move=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    home.promote(model_id, version)
    dev = (res.metrics or {}).get("dev") or {}
    print(f"model={model_id} version={version} promoted task={task}")
    _declare_task(settings, task, config)  # so records can be uploaded
    print(f"home={home.root.resolve()}")
    print(f"mechanism={config['mechanism']} params={json.dumps(config['params'], sort_keys=True)}"
          f" bundle_id={config['bundle_id']}")
    print(f"guarantee: {summary(config['guarantee'])}")
    levers = (config.get("recipe") or {}).get("levers") or []
    print(f"recipe: {', '.join(levers) or 'plain fine-tuning'}")
    print(f"train_examples={res.n_train} of {rows} rows; dev_examples={res.n_dev}")
    if dev:  # on the privatization of the dev set the epoch was chosen on
        print(f"dev_accuracy={dev['accuracy']:.4f}")
    if fresh:  # the mean over fresh privatizations of the dev set, and each of them
        print(f"dev_accuracy_fresh={fresh['fresh_accuracy']:.4f} draws="
              + ",".join(f"{a:.4f}" for a in fresh["fresh_draws"]))
    print(f"elapsed={time.perf_counter() - t0:.1f}s")
    return 0


def _layers(layers: int | None, base: str | None, mechanism: str) -> int | None:
    """--layers, else the default for the packaged MiniLM's BERT classifiers (a --base and
    the vector MLPs keep what they have)."""
    if layers is not None or base is not None or kind_of(mechanism) == "vector":
        return layers
    return DEFAULT_LAYERS


def _fresh_dev(o: BootstrapOptions, model_dir: Path, bundle: EdgeBundle
               ) -> dict[str, Any] | None:
    """The kept model on the dev set privatized ``--dev-draws`` times afresh, recorded in the
    version's metrics.json (``dev.fresh_accuracy``, served by GET /v1/models)."""
    if o.dev is None or not o.dev_draws:
        return None
    import numpy as np

    # lazy: torch, only when bootstrap trains (the serve image has none)
    from models.training.experiment import evaluate_tsv

    seed = o.mech.seed
    seeds: list[np.random.SeedSequence] | list[None] = (
        np.random.SeedSequence(seed).spawn(o.dev_draws) if seed is not None
        else [None] * o.dev_draws)
    _say(f"measuring the kept model on {o.dev_draws} fresh privatization(s) of the dev set")
    progress = sys.stderr.isatty() and o.compute.progress
    accs = [evaluate_tsv(model_dir, o.dev, bundle=bundle, limit=o.dev_limit or None,
                         rng=np.random.default_rng(s) if s is not None else None,
                         device=o.compute.device, precision=o.compute.precision,
                         progress=progress)["accuracy"] for s in seeds]
    out = {"fresh_accuracy": float(np.mean(accs)), "fresh_draws": accs}
    path = model_dir / METRICS_FILE
    metrics = json.loads(path.read_text())
    metrics.setdefault("dev", {}).update(out)
    write_atomically(path, json.dumps(metrics, indent=2, sort_keys=True) + "\n",
                     durable=False)
    update_manifest(model_dir, [METRICS_FILE])  # the version was sealed when it was made
    return out


# -- the task in the record store -----------------------------------------------------
def _declare_task(settings: Settings, task: str, config: dict[str, Any]) -> None:
    """Declare the model's task in the record store (labels, mechanism, params, bundle), so
    that the edge can send records for it at once; a warning, not a failure, if it cannot."""

    task = config.get("task") or task
    db = Database.from_settings(settings)
    try:
        if db.auto_upgrade:
            db.upgrade()
        _, created = ensure_task(db, task, config["labels"], config["mechanism"],
                                 config["params"], config["bundle_id"],
                                 (config.get("source") or {}).get("pairs"))
        print(f"task={task} {'declared' if created else 'already declared'} "
              f"(POST /v1/records accepts its records)")
    except ServiceError as exc:
        _say(f"warning: task {task} not declared in the record store: {exc.detail}")
    finally:
        db.dispose()
# -- end record store ------------------------------------------------------------------------

