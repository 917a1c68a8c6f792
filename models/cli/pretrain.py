"""`cloud-api pretrain`: privacy-adaptive MLM pretraining (Qu et al. 2021 §3.4).

    cloud-api pretrain --objective denoising --mechanism dchi-text --eta 65 --out runs/den-65 --steps 2000

Bad input (unknown objective or mechanism, η ≤ 0 or below the privacy floor (unless
``--allow-weak-privacy``), a missing or empty corpus, a base
of another bundle or dimension) prints one line ``cloud-api: error: ...`` and exits 2
before any training starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

from edge_agent.mechanism_spec import entries
from edge_agent.param_flags import add_param_flags
from models.cli.options import options_of
from shared.accounting import summary
from shared.bundle import BundleError, EdgeBundle
from shared.floor import WeakPrivacyError
from shared.mechanisms import registry

_PROG = "cloud-api"


def _error(message: str) -> NoReturn:
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


@dataclass(frozen=True)
class PretrainOptions:
    """``cloud-api pretrain``: what its flags say, parsed once."""

    objective: str
    mechanism: str
    eta: float
    base: str | None
    bundle: str | None
    corpus: list[str | os.PathLike[str]] | None
    out: str
    steps: int | None
    epochs: int | None
    batch_size: int
    max_length: int
    lr: float
    warmup_ratio: float
    prob_k: int
    mask_rate: float
    max_predictions: int
    head_warmup_steps: int
    save_every: int
    keep_checkpoints: int
    resume: bool
    seed: int | None
    device: str
    precision: str
    progress: bool
    allow_weak_privacy: bool

    @classmethod
    def parse(cls, args: argparse.Namespace) -> PretrainOptions:
        return options_of(cls, args, progress=not args.no_progress)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "pretrain", help="privacy-adaptive MLM pretraining on a public corpus (Qu et al. §3.4)",
        description="Continue BERT pretraining on a public corpus privatized on the fly with the "
                    "task's mechanism and eta; the word-embedding table stays frozen.")
    p.error = _error  # one line, no usage dump
    p.add_argument("--objective", required=True, help="vanilla | prob | denoising")
    dchi = registry.dchi_names()  # pretraining simulates the dχ mechanisms
    p.add_argument("--mechanism", required=True, help=" | ".join(dchi))
    add_param_flags(p, with_defaults=False, required=True,
                    mechs=[e for e in entries() if e["name"] in dchi],
                    suffix={"eta": "the same eta as the target task"})
    p.add_argument("--base", default=None, help="BERT folder (default: the packaged MiniLM-L6-H384)")
    p.add_argument("--bundle", default=None,
                   help="edge bundle folder to pretrain for (default: the base's own bundle)")
    p.add_argument("--corpus", nargs="+", default=None, metavar="FILE",
                   help="text files, one document per line; .tsv = first column "
                        "(default: ../shared/data/corpus/agnews.txt and the SST-2 training sentences)")
    p.add_argument("--out", required=True, help="output folder (a BERT folder usable as --base)")
    n = p.add_mutually_exclusive_group()
    n.add_argument("--steps", type=int, default=None)
    n.add_argument("--epochs", type=int, default=None, help="default 1 when --steps is not given")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warmup-ratio", type=float, default=0.01)
    p.add_argument("--prob-k", type=int, default=10, help="privatizations per masked position (Prob MLM)")
    p.add_argument("--mask-rate", type=float, default=0.15)
    p.add_argument("--max-predictions", type=int, default=20)
    p.add_argument("--head-warmup-steps", type=int, default=0,
                   help="train only the new MLM head for the first N steps (encoder frozen)")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-checkpoints", type=int, default=2)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--seed", type=int, default=None,
                   help="reproducible noise and masks (prints a warning)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--precision", default="auto", help="auto | fp32 | bf16 | fp16")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--allow-weak-privacy", action="store_true",
                   help="pretrain for an eta weaker than the privacy floor (experiments only)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The command's entry: its flags parsed once, then :func:`pretrain_command`."""
    return pretrain_command(PretrainOptions.parse(args))


def pretrain_command(o: PretrainOptions) -> int:
    if o.seed is not None:
        print(f"{_PROG}: warning: --seed {o.seed} makes the privatization noise reproducible; "
              "anyone who knows the seed can undo it. Acceptable for a public pretraining corpus, "
              "never for user data.", file=sys.stderr)
    try:
        # lazy: torch, only when the command runs (its parser and --help load none)
        from models.pretraining.pretrain import pretrain

        bundle = None
        if o.bundle is not None:

            bundle = EdgeBundle.load(o.bundle)
        out = pretrain(o.base, o.out, o.objective, o.mechanism, o.eta,
                       steps=o.steps, epochs=o.epochs, batch_size=o.batch_size,
                       corpus_paths=o.corpus,
                       bundle=bundle, device=o.device,
                       precision=o.precision, resume=o.resume,
                       progress=o.progress, max_length=o.max_length, lr=o.lr,
                       warmup_ratio=o.warmup_ratio, prob_k=o.prob_k,
                       mask_rate=o.mask_rate, max_predictions=o.max_predictions,
                       save_every=o.save_every, keep_checkpoints=o.keep_checkpoints,
                       head_warmup_steps=o.head_warmup_steps,
                       seed=o.seed, allow_weak_privacy=o.allow_weak_privacy)
    except WeakPrivacyError as exc:
        _error(f"{exc}; --allow-weak-privacy pretrains for it anyway")
    except (ValueError, BundleError, OSError) as exc:
        _error(str(exc))
    info = json.loads((out / "pretrain.json").read_text())
    print(f"privacy of the inputs it was adapted to: {summary(info['guarantee'])}", file=sys.stderr)
    if info.get("weak_privacy"):
        print(f"weak privacy (--allow-weak-privacy): {info['weak_privacy']}", file=sys.stderr)
    print(f"pretrained model: {out}")
    return 0
