"""`cloud-api pretrain`: privacy-adaptive MLM pretraining (Qu et al. 2021 §3.4).

    cloud-api pretrain --objective denoising --mechanism dchi-text --eta 65 --out runs/den-65 --steps 2000

Bad input (unknown objective or mechanism, η ≤ 0 or below the privacy floor (unless
``--allow-weak-privacy``), a missing or empty corpus, a base
of another bundle or dimension) prints one line ``cloud-api: error: ...`` and exits 2
before any training starts.
"""

from __future__ import annotations

import argparse
import sys

from edge_agent.mechanism_spec import entries
from edge_agent.param_flags import add_param_flags
from shared.accounting import summary
from shared.bundle import BundleError, EdgeBundle
from shared.floor import WeakPrivacyError
from shared.mechanisms import registry

_PROG = "cloud-api"


def _error(message: str) -> None:
    print(f"{_PROG}: error: {message}", file=sys.stderr)
    sys.exit(2)


def register(subparsers) -> None:
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
    if args.seed is not None:
        print(f"{_PROG}: warning: --seed {args.seed} makes the privatization noise reproducible; "
              "anyone who knows the seed can undo it. Acceptable for a public pretraining corpus, "
              "never for user data.", file=sys.stderr)
    try:
        # lazy: torch, only when the command runs (its parser and --help load none)
        from models.pretraining.pretrain import pretrain

        bundle = None
        if args.bundle is not None:

            bundle = EdgeBundle.load(args.bundle)
        out = pretrain(args.base, args.out, args.objective, args.mechanism, args.eta,
                       steps=args.steps, epochs=args.epochs, batch_size=args.batch_size,
                       corpus_paths=args.corpus, bundle=bundle, device=args.device,
                       precision=args.precision, resume=args.resume,
                       progress=not args.no_progress, max_length=args.max_length, lr=args.lr,
                       warmup_ratio=args.warmup_ratio, prob_k=args.prob_k,
                       mask_rate=args.mask_rate, max_predictions=args.max_predictions,
                       save_every=args.save_every, keep_checkpoints=args.keep_checkpoints,
                       head_warmup_steps=args.head_warmup_steps,
                       seed=args.seed, allow_weak_privacy=args.allow_weak_privacy)
    except WeakPrivacyError as exc:
        _error(f"{exc}; --allow-weak-privacy pretrains for it anyway")
    except (ValueError, BundleError, OSError) as exc:
        _error(str(exc))
    import json

    info = json.loads((out / "pretrain.json").read_text())
    print(f"privacy of the inputs it was adapted to: {summary(info['guarantee'])}", file=sys.stderr)
    if info.get("weak_privacy"):
        print(f"weak privacy (--allow-weak-privacy): {info['weak_privacy']}", file=sys.stderr)
    print(f"pretrained model: {out}")
    return 0
