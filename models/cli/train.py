"""`cloud-api train | evaluate | export-bundle`: offline experiments and exports.

    cloud-api train --data train.tsv --dev dev.tsv --mechanism dchi-text --eta 65 --out var/m1
    cloud-api train --records edge.jsonl --out var/m2
    cloud-api evaluate --model var/m1 --data dev.tsv
    cloud-api evaluate --attack --mechanism dchi-text --eta 65 --data dev.tsv
    cloud-api export-bundle --out var/bundle [--model-dir BERT] [--pooling mean]
    cloud-api export-bundle --onnx --model var/m1

Bad input prints one line ``cloud-api: error: ...`` and exits 2 before any training.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.errors import one_line
from edge_agent.param_flags import add_attack_flags, positive_int
from models.cli.flags import (
    PROG,
    DeviceFlags,
    MechanismFlags,
    RecipeFlags,
    add_device_args,
    add_mechanism_args,
    add_recipe_args,
    apply_policy,
    policy_arg,
    posterior_table,
    seeded_rng,
    table_name,
)
from models.cli.options import entry, options_of, parsed
from models.training.data import read_records_jsonl
from models.training.posterior import POSTERIOR_FILE, ChannelPosterior
from models.training.privatize import build_mechanism, load_bundle, mechanism_from_params
from models.training.recipe import DEFAULT_EPOCHS, Recipe, default_recipe
from models.versions.manifest import folder_files, update_manifest
from models.versions.version_folder import (
    BUNDLE_DIR,
    DENOISER_FILE,
    INT8_FILE,
    is_model_dir,
    read_config,
)
from shared.accounting import dchi_diameter_bound, summary
from shared.bundle import BundleError, EdgeBundle, save_atomically
from shared.floor import WeakPrivacyError
from shared.mechanisms import NoPrivacy, registry
from shared.policy import DEFAULT_P, NO_POLICY, policy_for_new_model
from shared.table import DEFAULT_TABLE, MATCHED_ETA, table_for_new_model

if TYPE_CHECKING:  # torch: the command's parser and --help load none
    from models.attacks.denoiser import Denoiser
    from models.training.experiment import TrainResult


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


_EXPECTED = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, BundleError,
             KeyError)


def _failed(exc: BaseException) -> int:
    print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
    return 2


def _info(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def recipe_from_flags(flags: RecipeFlags, mechanism: str, raw_text: bool) -> Recipe:
    """The default recipe for ``mechanism`` with the flags given applied on top; a lever
    that makes no sense here is refused (ValueError, one line)."""
    r = default_recipe(mechanism, raw_text)
    changes: dict[str, Any] = {k: v for k, v in (("fresh_noise", flags.fresh_noise),
                                 ("posterior", flags.posterior), ("denoise", flags.denoise),
                                 ("distill", flags.distill), ("ema", flags.ema),
                                 ("rtd", flags.rtd), ("warm_start", flags.warm_start))
               if v is not None}
    if flags.teacher is not None and not (changes.get("distill", r.distill)
                                          or changes.get("warm_start", r.warm_start)):
        raise ValueError("--teacher needs --distill ALPHA > 0 or --warm-start")
    if flags.posterior_table is not None and changes.get("posterior") is False:
        raise ValueError("--posterior-table contradicts --no-posterior")
    if flags.posterior_table is not None:
        changes["posterior"] = True
    den: dict[str, Any] = {k: v for k, v in (("denoiser_layers", flags.denoiser_layers),
                             ("denoiser_candidates", flags.denoiser_candidates),
                             ("denoiser_epochs", flags.denoiser_epochs),
                             ("denoiser_corpus", flags.denoiser_corpus)) if v is not None}
    if flags.denoiser is False and (den or flags.denoiser_file is not None):
        raise ValueError("--denoiser-* options contradict --no-denoiser")
    if flags.denoiser_file is not None and den:
        raise ValueError("--denoiser-file is trained already: --denoiser-layers, -candidates, "
                         "-epochs and -corpus do not apply to it")
    if flags.denoiser is not None:
        changes["denoiser"] = flags.denoiser
    if den or flags.denoiser_file is not None:
        changes["denoiser"] = True
    if "denoiser_corpus" in den:
        # lazy: torch, only when the command runs (its parser and --help load none)
        from models.attacks.denoiser_train import read_corpus

        read_corpus(den["denoiser_corpus"])  # a missing or empty file: an error now
        den["denoiser_corpus"] = str(den["denoiser_corpus"])
    r = dataclasses.replace(r, **changes, **den)
    if not raw_text and r.denoiser_corpus:
        raise ValueError("--denoiser-corpus trains a denoiser: device records read an "
                         "existing one (--denoiser-file or the --base version's)")
    r.check(mechanism, raw_text)
    return r


def _denoiser_file(path: str | os.PathLike[str], bundle_dir: str | None = None) -> Denoiser:
    """A trained denoiser file, its word table from ``bundle_dir`` (None: MiniLM's)."""
    # lazy: torch, only when the command runs (its parser and --help load none)
    from models.attacks.denoiser import Denoiser
    from models.nets.backbone import model_embeddings

    return Denoiser.load(path, model_embeddings(load_bundle(bundle_dir=bundle_dir)))


def records_denoiser(file: str | None, base: str | None,
                     bundle_dir: str | None = None) -> Denoiser | None:
    """The denoiser for device records: ``--denoiser-file``, else the ``--base`` model
    version's ``denoiser.safetensors``, else None."""
    if file is not None:
        return _denoiser_file(file, bundle_dir)
    if base is not None and is_model_dir(base) and (Path(base) / DENOISER_FILE).is_file():
        return _denoiser_file(Path(base) / DENOISER_FILE, bundle_dir)
    return None


@dataclass(frozen=True)
class TrainOptions:
    """``cloud-api train``: what its flags say, parsed once."""

    data: str | None
    records: str | None
    dev: str | None
    dev_records: str | None
    mechanism: str | None
    mech: MechanismFlags
    allow_weak_privacy: bool
    base: str | None
    out: str
    epochs: int
    lr: float | None
    batch_size: int
    max_length: int
    pooling: str
    layers: int | None
    limit: int | None
    dev_limit: int | None
    recipe: RecipeFlags
    compute: DeviceFlags

    @classmethod
    def parse(cls, args: argparse.Namespace) -> TrainOptions:
        return options_of(cls, args, mech=MechanismFlags.parse(args),
                          recipe=options_of(RecipeFlags, args), compute=DeviceFlags.parse(args))


@dataclass(frozen=True)
class EvaluateOptions:
    """``cloud-api evaluate`` (and ``--attack``): what its flags say, parsed once."""

    model: str | None
    data: str | None
    records: str | None
    limit: int | None
    json: bool
    mechanism: str | None
    mech: MechanismFlags
    attack: bool
    tokens: str | None
    target_inversion: float | None
    samples: int
    inversion_tokens: int
    denoiser: str | None
    draws: int
    words: int
    max_length: int
    compute: DeviceFlags

    @classmethod
    def parse(cls, args: argparse.Namespace) -> EvaluateOptions:
        return options_of(cls, args, mech=MechanismFlags.parse(args),
                          compute=DeviceFlags.parse(args))


@dataclass(frozen=True)
class ExportOptions:
    """``cloud-api export-bundle``: what its flags say, parsed once."""

    out: str | None
    model_dir: str | None
    pooling: str
    table: str | None
    policy: str | None
    onnx: bool
    model: str | None


def register(subparsers: argparse._SubParsersAction) -> None:
    t = subparsers.add_parser("train", help="privatize a labelled TSV (or read edge records) "
                              "and fine-tune a classifier",
                              description="Privacy-constrained fine-tuning (Qu et al. §3.3).",
                              allow_abbrev=False)
    t.error = _error
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", metavar="TRAIN.tsv",
                     help="header sentence<TAB>label or sentence_a<TAB>sentence_b<TAB>label")
    src.add_argument("--records", metavar="FILE.jsonl", help="the edge agent's JSONL records")
    dev = t.add_mutually_exclusive_group()
    dev.add_argument("--dev", metavar="DEV.tsv", help="dev set, privatized the same way")
    dev.add_argument("--dev-records", metavar="FILE.jsonl", help="dev records (JSONL)")
    add_mechanism_args(t)
    t.add_argument("--allow-weak-privacy", action="store_true",
                   help="train even with parameters weaker than the privacy floor "
                        "(shared.floor: privatized text close to the raw text); refused "
                        "otherwise, before any work")
    t.add_argument("--base", metavar="DIR", help="BERT folder or pretraining checkpoint "
                   "(default: the packaged MiniLM-L6-H384)")
    t.add_argument("--out", required=True, metavar="DIR", help="new model version folder")
    t.add_argument("--epochs", type=positive_int, default=DEFAULT_EPOCHS,
                   help=f"passes over the training set ({DEFAULT_EPOCHS})")
    t.add_argument("--lr", type=float, help="learning rate (default: 1e-4 for a BERT reading "
                   "token ids, 2e-5 for one reading embeddings, 1e-3 for the vector MLP)")
    t.add_argument("--batch-size", type=positive_int, default=32)
    t.add_argument("--max-length", type=positive_int, default=128)
    t.add_argument("--pooling", choices=("mean", "cls"), default="mean",
                   help="sentence pooling of the BERT classifiers")
    t.add_argument("--layers", type=positive_int, metavar="N",
                   help="keep the first N transformer layers of the base (a smaller, faster "
                        "model; default: all)")
    t.add_argument("--limit", type=positive_int, help="first N training rows only")
    t.add_argument("--dev-limit", type=positive_int, help="first N dev rows only")
    add_recipe_args(t)
    add_device_args(t)
    t.set_defaults(func=entry(run_train, TrainOptions.parse, _EXPECTED, _failed))

    e = subparsers.add_parser("evaluate", help="accuracy of a model on a privatized test set, "
                              "or (--attack) the privacy evaluation of a mechanism",
                              allow_abbrev=False)
    e.error = _error
    e.add_argument("--model", metavar="DIR", help="model version folder")
    esrc = e.add_mutually_exclusive_group(required=True)
    esrc.add_argument("--data", metavar="TEST.tsv", help="labelled TSV (attack: its sentences)")
    esrc.add_argument("--records", metavar="FILE.jsonl", help="privatized labelled records")
    e.add_argument("--limit", type=positive_int, help="first N rows only")
    e.add_argument("--json", action="store_true", help="print the full report as JSON")
    add_mechanism_args(e)
    a = e.add_argument_group("privacy evaluation (--attack)")
    a.add_argument("--attack", action="store_true",
                   help="dchi: token inversion and N_w/S_w; laplace/ome/texthide: attacker MLP")
    a.add_argument("--tokens", default=None, metavar="N|all",
                   help="dchi: vocabulary tokens for N_w/S_w (default all on GPU, 500 on CPU)")
    add_attack_flags(a, inversion_tokens=20000, scope="dchi: ")
    a.add_argument("--denoiser", metavar="VERSION|FILE",
                   help="dchi-text: also the contextual attack, with this model version's "
                        "denoiser (or a denoiser.safetensors) trained on public text")
    a.add_argument("--draws", type=positive_int, default=3, metavar="D",
                   help="dchi-text with --denoiser: fresh privatizations of the data (3)")
    a.add_argument("--words", type=positive_int, default=30, metavar="W",
                   help="vector kinds: most frequent content words to recover (30)")
    a.add_argument("--max-length", type=positive_int, default=128)
    add_device_args(e)
    e.set_defaults(func=entry(run_evaluate, EvaluateOptions.parse, _EXPECTED, _failed))

    x = subparsers.add_parser("export-bundle", help="write the edge bundle with encoder.onnx, "
                              "or (--onnx) classifier.onnx into a model folder",
                              allow_abbrev=False)
    x.error = _error
    x.add_argument("--out", metavar="DIR", help="bundle folder to write")
    x.add_argument("--model-dir", metavar="BERT", help="BERT folder (default: MiniLM-L6-H384)")
    x.add_argument("--pooling", choices=("mean", "cls"), default="mean",
                   help="sentence pooling of the encoder (mean: MiniLM's own, unnormalised)")
    x.add_argument("--table", metavar="NAME", type=table_name,
                   help="a bundle for dchi-text with this privatization table (shared.table: "
                        "pca32-int8, pca64, none-int8, ...; no encoder.onnx): the projection "
                        "is fitted on the model's own word embeddings, never on text")
    x.add_argument("--policy", metavar="NAME", type=policy_arg,
                   help="a bundle for dchi-text with this token policy (its public words: "
                        "shared.policy; no encoder.onnx)")
    x.add_argument("--onnx", action="store_true", help="export a trained model's classifier")
    x.add_argument("--model", metavar="DIR", help="model version folder (with --onnx)")
    x.set_defaults(func=entry(run_export, parsed(ExportOptions), _EXPECTED, _failed))


# -- train -----------------------------------------------------------------------------------
def _keep_bundle(bundle: EdgeBundle | str | None, model_dir: str | os.PathLike[str]) -> None:
    """A bundle with a designed privatization table goes into the version folder
    (``bundle/``): ``cloud-api models register`` and ``evaluate`` find it there."""
    b = bundle if isinstance(bundle, EdgeBundle) or bundle is None else \
        load_bundle(bundle_dir=bundle)
    if b is not None and (not b.has_embeddings or b.policy is not None):
        save_atomically(b, Path(model_dir) / BUNDLE_DIR)
        # the version was sealed when it was made (issue 42): the bundle's files join it
        update_manifest(model_dir, [f for f in folder_files(model_dir)
                                    if f.startswith(f"{BUNDLE_DIR}/")])
        print(f"bundle={Path(model_dir) / BUNDLE_DIR} ({b.describe_table()})", file=sys.stderr)


def run_train(o: TrainOptions) -> int:
    # lazy: torch, only when the command runs (its parser and --help load none)
    from models.training.experiment import train_from_records, train_from_tsv
    from models.training.finetune import TrainConfig

    m, compute = o.mech, o.compute
    compute.check()
    rng = seeded_rng(m.seed)
    cfg = TrainConfig(epochs=o.epochs, lr=o.lr, batch_size=o.batch_size,
                      max_length=o.max_length, pooling=o.pooling, seed=m.seed,
                      device=compute.device, precision=compute.precision,
                      progress=compute.progress, layers=o.layers)
    cfg.validate()
    if o.data is not None:
        if o.mechanism is None:
            raise ValueError("--mechanism is required with --data")
        if o.dev_records is not None:
            raise ValueError("--data takes --dev TSV (privatized the same way), not "
                             "--dev-records")

        recipe = recipe_from_flags(o.recipe, o.mechanism, raw_text=True)
        posterior = (posterior_table(o.recipe.posterior_table) if o.recipe.posterior_table
                     else None)
        den = (_denoiser_file(o.recipe.denoiser_file, m.bundle) if o.recipe.denoiser_file
               else None)
        bundle: EdgeBundle | str | None = m.bundle

        table = table_for_new_model(o.mechanism, m.table,
                                    m.bundle is not None or o.base is not None)
        if m.table is None and table is not None:
            _info(f"note: privatization table {DEFAULT_TABLE}, the default for new dchi-text "
                  f"models (eta {MATCHED_ETA[DEFAULT_TABLE]:g} on it matches eta "
                  f"{MATCHED_ETA['none']:g} on the 384-d table; --table none for that one)")

        settings = m.settings()
        policy = policy_for_new_model(o.mechanism, m.policy,
                                      m.bundle is not None or o.base is not None)
        if m.policy is None and policy != NO_POLICY:
            _info(f"note: token policy {policy}, the default for new dchi-text models (its "
                  "public words are sent as typed with probability 1 - public_p, default "
                  f"{1 - DEFAULT_P:g}; --policy none privatizes every token)")
        if table is not None or policy != NO_POLICY:

            bundle = apply_policy(load_bundle(bundle_dir=m.bundle, model_dir=o.base,
                                              table=table),
                                  policy if policy != NO_POLICY else m.policy, settings)
        try:
            res = train_from_tsv(o.data, o.out, o.mechanism, settings,
                                 dev_tsv=o.dev, bundle=bundle, base=o.base,
                                 cfg=cfg, limit=o.limit, dev_limit=o.dev_limit, rng=rng,
                                 allow_weak_privacy=o.allow_weak_privacy, recipe=recipe,
                                 teacher=o.recipe.teacher, posterior=posterior, denoiser=den)
        except WeakPrivacyError as exc:
            raise WeakPrivacyError(f"{exc}; --allow-weak-privacy trains on it anyway") from None
        _keep_bundle(bundle, res.model_dir)
    else:
        assert o.records is not None  # --data and --records: one is required

        if o.dev is not None:
            raise ValueError("--records takes --dev-records (JSONL), not --dev")
        if m.table is not None or m.policy is not None:
            raise ValueError("--records were privatized with their bundle already: pass it "
                             "with --bundle DIR, not --table or --policy")
        if o.mechanism is not None:
            _info("note: --records carry their mechanism; the mechanism flags are ignored")
        records = read_records_jsonl(o.records, limit=o.limit)
        dev = (read_records_jsonl(o.dev_records, limit=o.dev_limit)
               if o.dev_records else None)
        mechanism = records[0].payload.mechanism if records else NoPrivacy.name
        note = None
        explicit = o.recipe.posterior is True or o.recipe.posterior_table is not None
        recipe = recipe_from_flags(o.recipe, mechanism, raw_text=False)
        posterior = None
        if recipe.posterior:
            posterior = records_posterior(o.recipe.posterior_table, o.base)
            if posterior is None and explicit:
                raise ValueError("--posterior with --records needs --posterior-table FILE or "
                                 "a --base model version that has a posterior.npz")
            if posterior is None:  # said in the summary, after the checks of the records
                note = ("no posterior table for these records (--posterior-table FILE or a "
                        "--base version with one)")
                recipe = dataclasses.replace(recipe, posterior=False)
        den = None
        if recipe.denoiser:
            den = records_denoiser(o.recipe.denoiser_file, o.base, m.bundle)
            if den is None:
                raise ValueError("--denoiser with --records needs --denoiser-file FILE or a "
                                 "--base model version that has a denoiser.safetensors "
                                 "(records cannot train one: it comes from public text)")
        res = train_from_records(records, o.out, bundle=m.bundle, dev_records=dev,
                                 base=o.base, cfg=cfg, recipe=recipe, posterior=posterior,
                                 denoiser=den)
        _keep_bundle(m.bundle, res.model_dir)
        _print_trained(res, note)
        return 0
    _print_trained(res)
    return 0


def records_posterior(table_path: str | None, base: str | None) -> ChannelPosterior | None:
    """The posterior table for device records: ``--posterior-table``, else the ``--base``
    model version's ``posterior.npz``, else None."""
    if table_path is not None:
        return posterior_table(table_path)
    if base is not None and is_model_dir(base) and (Path(base) / POSTERIOR_FILE).is_file():
        return posterior_table(Path(base) / POSTERIOR_FILE)
    return None


def _print_trained(res: TrainResult, note: str | None = None) -> None:
    cfg = read_config(res.model_dir)
    print(f"model={res.model_dir}")
    print(f"mechanism={cfg['mechanism']} params={json.dumps(cfg['params'], sort_keys=True)}")
    print(f"guarantee: {summary(cfg['guarantee'])}")
    if cfg.get("weak_privacy"):
        print(f"weak privacy (--allow-weak-privacy): {cfg['weak_privacy']}: the training "
              "text was close to the raw text")
    recipe = cfg.get("recipe") or {}
    print(f"recipe: {', '.join(recipe.get('levers') or []) or 'plain fine-tuning'}"
          + (f" ({note})" if note else ""))
    print(f"train_examples={res.n_train} dev_examples={res.n_dev} "
          f"fingerprint={res.fingerprint[:16]}")
    dev = res.metrics.get("dev")
    if dev:
        print(f"dev_accuracy={dev['accuracy']:.4f} best_epoch={res.metrics['best_epoch']}")


# -- evaluate --------------------------------------------------------------------------------
def run_evaluate(o: EvaluateOptions) -> int:
    if o.attack:
        return run_attack(o)
    # lazy: torch, only when the command runs (its parser and --help load none)
    from models.training.experiment import evaluate_records, evaluate_tsv

    if o.model is None:
        raise ValueError("evaluate needs --model DIR (or --attack)")
    compute = o.compute
    compute.check()
    if o.data is not None:
        rng = seeded_rng(o.mech.seed)
        rep = evaluate_tsv(o.model, o.data, bundle=o.mech.bundle, rng=rng, limit=o.limit,
                           texthide_key=o.mech.texthide_key, device=compute.device,
                           precision=compute.precision,
                           progress=compute.progress)
    else:
        assert o.records is not None  # --data and --records: one is required

        rep = evaluate_records(o.model, read_records_jsonl(o.records, limit=o.limit),
                               device=compute.device, precision=compute.precision)
    if o.json:
        print(json.dumps(rep, indent=2, sort_keys=True))
        return 0
    print(f"accuracy={rep['accuracy']:.4f}")
    print(f"n={rep['n']} macro_f1={rep['macro_f1']:.4f}")
    for name, v in rep["per_class"].items():
        print(f"class={name} precision={v['precision']:.4f} recall={v['recall']:.4f} "
              f"f1={v['f1']:.4f} support={v['support']}")
    return 0


def run_attack(o: EvaluateOptions) -> int:
    # lazy: torch, only when the command runs (its parser and --help load none)
    from models.attacks import attack

    if o.data is None:
        raise ValueError("--attack needs --data (a TSV or text file of sentences)")
    m, compute = o.mech, o.compute
    rng = seeded_rng(m.seed)
    if o.model is not None:
        cfg = read_config(o.model)
        name, params = cfg["mechanism"], dict(cfg["params"])
        bundle = load_bundle(bundle_dir=m.bundle, expected_id=cfg["bundle_id"]) \
            if m.bundle else load_bundle(expected_id=cfg["bundle_id"],
                                         version_dir=o.model)
    else:
        if o.mechanism is None:
            raise ValueError("--attack needs --mechanism (and its parameters) or --model")
        name, params = o.mechanism, None
        bundle = load_bundle(bundle_dir=m.bundle, table=m.table)
    if o.denoiser is not None and name not in registry.substituting_names():
        raise ValueError(f"--denoiser makes no sense for {name}: a contextual denoiser "
                         f"exists for {' and '.join(registry.substituting_names())} only")
    texts = attack.read_sentences(o.data, o.limit)
    cls = registry.get(name)
    if cls.family == "dchi":  # token by token: the dχ report
        eta = params["eta"] if params else m.values.get("eta")
        if (eta is None) == (o.target_inversion is None):
            raise ValueError("give either --eta or --target-inversion")
        if o.denoiser is not None and eta is None:
            raise ValueError("--denoiser attacks at the eta it was trained for: give --eta, "
                             "not --target-inversion")
        source = o.denoiser
        denoiser = (attack.load_denoiser(source, bundle, name, eta)
                    if source is not None and eta is not None else None)  # refused before any work
        tokens = None if o.tokens is None else (
            "all" if o.tokens == "all" else positive_int(o.tokens))
        rep = attack.token_privacy(bundle, name, eta=eta, target=o.target_inversion,
                                   texts=texts, tokens=tokens, samples=o.samples,
                                   inversion_tokens=o.inversion_tokens, rng=rng,
                                   device=compute.device)
        ctx = (attack.contextual_attack(denoiser, bundle, texts, draws=o.draws, rng=rng,
                                        source=source)
               if denoiser is not None and source is not None else None)
        if o.json:
            print(json.dumps({**attack.token_report_json(rep), "contextual_attack": ctx},
                             indent=2))
        else:
            print(attack.format_token_report(rep, ctx))
        return 0
    if not cls.private:
        raise ValueError(f"mechanism {name} sends the text's ids: there is nothing to attack")
    if params is not None:
        mech = mechanism_from_params(name, params, bundle, m.texthide_key)
    else:

        mech = build_mechanism(name, bundle, **m.settings())
    rep = attack.vector_attack(bundle, mech, texts, n_words=o.words, rng=rng,
                               device=compute.device, max_length=o.max_length,
                               progress=compute.progress)
    print(json.dumps(rep, indent=2) if o.json else attack.format_vector_attack(rep))
    return 0


# -- export ----------------------------------------------------------------------------------
def run_export(o: ExportOptions) -> int:
    # lazy: torch, only when the command runs (its parser and --help load none)
    from models.export.writers import export_bundle, export_classifier_onnx

    if o.onnx:
        if o.model is None:
            raise ValueError("--onnx needs --model DIR (a trained model version)")
        path = export_classifier_onnx(o.model)
        print(f"classifier={path}")
        print(f"classifier_int8={path.with_name(INT8_FILE)}")
        return 0
    if o.out is None:
        raise ValueError("export-bundle needs --out DIR (or --onnx --model DIR)")
    if (o.table is not None and o.table != "none") or o.policy not in (None, "none"):
        return _export_table_bundle(o.out, o.model_dir, o.table, o.policy)
    bundle = export_bundle(o.out, o.model_dir, o.pooling)
    enc = bundle.meta["encoder"]
    print(f"bundle={o.out}")
    print(f"bundle_id={bundle.bundle_id}")
    print(f"encoder pooling={enc['pooling']} output_dim={enc['output_dim']} "
          f"max_abs_diff_vs_torch={enc['checked_max_abs_diff']:.2e}")
    return 0


def _export_table_bundle(out_dir: str, model_dir: str | None, table: str | None,
                         policy: str | None) -> int:
    """``export-bundle --table``: a bundle whose privatization table is designed
    (``shared.table``), saved atomically; what it holds and what it costs on the wire."""
    bundle = EdgeBundle.from_model(model_dir, table=table, policy=policy)
    out = save_atomically(bundle, out_dir)
    loaded = EdgeBundle.load(out, expected_id=bundle.bundle_id)  # it reads back whole
    size = sum(p.stat().st_size for p in Path(out).iterdir() if p.is_file())
    info = loaded.table_info
    print(f"bundle={out_dir}")
    print(f"bundle_id={loaded.bundle_id}")
    print(f"{loaded.describe_table()}; projection {json.dumps(info['projection'])}")
    print(f"size={size} bytes ({size / 1e6:.2f} MB); tarball {len(loaded.to_tar_bytes())} bytes")
    print(f"diameter bound D = 2 max||phi|| = "
          f"{dchi_diameter_bound(loaded.table, loaded.regular_ids):.4f} (worst case eta*D per "
          "token); " + ("serves dchi-text only" if not loaded.has_embeddings else
                        "serves dchi-text and dchi-embedding"))
    if loaded.policy is not None:
        print(f"token policy {loaded.policy.name}: {loaded.policy.size} public words "
              f"(sha256 {loaded.policy.digest[:12]}…), sent as typed with probability "
              "1 - public_p")
    return 0
