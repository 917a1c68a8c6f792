"""`edge-agent` command line: privatize, budget, report, bundle fetch|info.

The flags are parsed here (and in ``privatize.cli``, ``budget.cli``) into typed options
(``edge_agent.privatize.options``); nothing below this layer sees an argparse namespace.
Errors print one line ``edge-agent: error: ...`` on stderr (no traceback) and exit 2 for
usage (bad flags, invalid parameters), 3 when the privacy budget refuses a run, or 1 at run
time (bad input line, bundle, server). Heavy modules load only when a command needs them.
"""

from __future__ import annotations

import argparse
import os
import sys

from edge_agent.budget import cli as cli_budget
from edge_agent.cli_args import LazyChoices, Parser, add_bundle_args, server_options
from edge_agent.errors import PROG, BudgetRefused, CliError, UsageError, info, one_line, warn
from edge_agent.param_flags import add_attack_flags
from edge_agent.privatize import cli as cli_privatize
from edge_agent.privatize.options import DEFAULT_MECHANISM
from edge_agent.report import build_report, format_report, plot_report
from edge_agent.service.bundle_cache import bundle_for_model, fetch_bundle
from edge_agent.service.connect import make_client, resolve_bundle
from shared.bundle import BundleError, EdgeBundle
from shared.mechanisms.registry import dchi_names
from shared.trust import trust


# -- parser -----------------------------------------------------------------------------------
def _usage(parser: argparse.ArgumentParser):
    """A command that prints ``parser``'s help on stderr and exits 2 (no action given)."""
    def show(_args) -> int:
        parser.print_help(sys.stderr)
        return 2
    return show


def _report_mechanisms() -> tuple[str, ...]:
    return dchi_names()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="privbert on the device: privatize text, post only "
                     "privatized payloads, choose eta with a privacy report")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    cli_privatize.register(sub)
    cli_budget.register(sub)

    p = sub.add_parser("report", help="privacy report for dχ-privacy (Qu et al. §5.3-5.4)",
                       description="Plausible deniability statistics N_w and S_w, token "
                       "embedding inversion accuracy, a table eta -> accuracy, and the honest "
                       "guarantee; with --target-inversion the eta that reaches it.")
    p.add_argument("--mechanism", choices=LazyChoices(_report_mechanisms),
                   default=DEFAULT_MECHANISM, metavar="NAME", help="%(choices)s; default "
                   "%(default)s")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--eta", type=float, help="privacy parameter eta > 0")
    add_attack_flags(p, inversion_tokens=5000, target=how)
    p.add_argument("--sample", metavar="FILE",
                   help="text (one per line; TSV: the first column) for inversion accuracy; "
                        "default: tokens drawn from the vocabulary")
    p.add_argument("--tokens", type=int, default=500, metavar="N",
                   help="regular tokens sampled for N_w and S_w (500)")
    p.add_argument("--etas", metavar="E1,E2,...",
                   help="eta grid of the accuracy table (default: the paper's 50..175 scaled "
                        "by n/768)")
    p.add_argument("--plot", metavar="OUT.png", help="figures like Qu et al. Fig. 3-4 "
                   "(needs matplotlib: pip install privbert[plot])")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--seed", type=int, help="seed of the simulation (reproducible report)")
    add_bundle_args(p)
    p.set_defaults(func=run_report)

    b = sub.add_parser("bundle", help="fetch or inspect an edge bundle")
    b.set_defaults(func=_usage(b))
    bsub = b.add_subparsers(dest="bundle_command", metavar="ACTION", parser_class=Parser)
    f = bsub.add_parser("fetch", help="fetch a served model's bundle into the cache")
    f.add_argument("--server", metavar="URL", required=True)
    f.add_argument("--model", metavar="ID", help="served model (default: the only one)")
    f.add_argument("--id", metavar="BUNDLE_ID", help="a bundle id instead of a model")
    f.add_argument("--api-key", metavar="KEY", help="default: $PRIVBERT_API_KEY")
    f.add_argument("--refresh", action="store_true", help="download again even if cached")
    f.add_argument("--timeout", type=float, default=30.0)
    f.add_argument("--retries", type=int, default=5)
    f.set_defaults(func=run_bundle_fetch)
    i = bsub.add_parser("info", help="describe a bundle directory (verifies every file)")
    i.add_argument("dir", metavar="DIR")
    i.set_defaults(func=run_bundle_info)
    return parser


# -- report and bundle commands --------------------------------------------------------------
def run_report(args) -> int:
    import json
    import math

    import numpy as np

    if args.eta is not None and not (math.isfinite(args.eta) and args.eta > 0):
        raise UsageError(f"--eta must be a finite number > 0, got {args.eta}")
    if args.target_inversion is not None and not 0 <= args.target_inversion <= 1:
        raise UsageError(f"--target-inversion must be in [0, 1], got {args.target_inversion}")
    if args.tokens < 1:
        raise UsageError(f"--tokens must be an integer >= 1, got {args.tokens}")
    etas = None
    if args.etas:
        try:
            etas = [float(x) for x in args.etas.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--etas must be numbers separated by commas, got {args.etas!r}"
                             ) from None
        if not etas or any(not (math.isfinite(e) and e > 0) for e in etas):
            raise UsageError(f"--etas must be finite numbers > 0, got {args.etas!r}")
    if args.plot:  # before minutes of computation
        check_plot_path(args.plot)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("--plot needs matplotlib: pip install 'privbert[plot]'") from None
    texts = read_sample(args.sample) if args.sample else None
    opts = server_options(args)
    bundle, _ = resolve_bundle(opts)

    info(trust(bundle.bundle_id, opts.trusted_bundles).note())  # what the report is about
    rng = np.random.default_rng(args.seed)
    rep = build_report(bundle, args.mechanism, eta=args.eta, target=args.target_inversion,
                       texts=texts, tokens=args.tokens, samples=args.samples,
                       inversion_tokens=args.inversion_tokens, etas=etas, rng=rng,
                       geometry=bool(args.plot), progress=info)
    if args.json:
        print(json.dumps(rep.to_json()))
    else:
        print(format_report(rep))
    if args.target_inversion is not None and \
            abs(rep.inversion_accuracy - args.target_inversion) > 0.01:
        warn(f"no eta reaches inversion accuracy {rep.target:g} within 0.01 on this sample "
             f"(closest: {rep.inversion_accuracy:.4f} at eta={rep.eta:.4g})")
    if args.plot:

        plot_report(rep, args.plot)
        info(f"figures written to {args.plot}")
    return 0


def check_plot_path(path: str) -> None:
    """CliError unless ``path`` can be written as a new or existing file."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise CliError(f"{path}: is a directory (--plot takes a file name, e.g. report.png)")
    parent = p.parent
    if not parent.is_dir():
        raise CliError(f"{parent}: no such directory for --plot")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise CliError(f"{path}: permission denied (--plot)")


def read_sample(path: str) -> list[str]:
    """Texts of a sample file (first column of a TSV), strict UTF-8, header skipped."""
    from pathlib import Path

    p = Path(path)
    if not p.exists():
        raise CliError(f"{path}: no such file")
    if p.is_dir():
        raise CliError(f"{path}: is a directory, not a text file")
    texts = []
    with open(p, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise CliError(f"{path}: line {n}: not valid UTF-8") from None
            first = line.split("\t")[0]
            if n == 1 and "\t" in line and line.split("\t")[-1].strip().lower() == "label":
                continue
            if first.strip():
                texts.append(first)
    if not texts:
        raise CliError(f"{path}: no text in the sample file")
    return texts


def run_bundle_fetch(args) -> int:
    with make_client(server_options(args)) as client:
        if args.id:
            if args.model:
                raise UsageError("give --model or --id, not both")
            bundle, path, fetched = fetch_bundle(client, args.id, refresh=args.refresh)
        else:
            bundle, _, path, fetched = bundle_for_model(client, args.model,
                                                        refresh=args.refresh)
    info(f"bundle {bundle.bundle_id} {'fetched and verified' if fetched else 'already cached'}")
    print(path)
    return 0


def run_bundle_info(args) -> int:
    import json
    from pathlib import Path

    p = Path(args.dir)
    if not p.exists():
        raise CliError(f"{p}: no such directory")
    if not p.is_dir():
        raise CliError(f"{p}: not a directory")
    b = EdgeBundle.load(p)
    sizes = {f: (p / f).stat().st_size for f in b.meta["files"]}
    print(json.dumps({
        "bundle_id": b.bundle_id, "path": str(p.resolve()), "verified": True,
        "vocab_size": b.vocab_size, "dim": b.dim, "max_length": b.max_length,
        "regular_tokens": int(b.regular_ids.size), "special_ids": b.special_ids,
        "encoder": b.meta.get("encoder"), "info": b.meta.get("info"),
        "files": {f: {"sha256": h, "bytes": sizes[f]} for f, h in b.meta["files"].items()},
    }, indent=2))
    return 0


# -- entry point ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except BudgetRefused as exc:
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        try:  # the reader went away (e.g. `| head`): stop quietly
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return 1
    except Exception as exc:  # every other failure: one line, no traceback
        if os.environ.get("EDGE_AGENT_DEBUG"):
            raise
        print(f"{PROG}: error: {describe(exc)}", file=sys.stderr)
        return 1


def describe(exc: Exception) -> str:
    """One line for a run-time failure. Never the input's text: decoding errors and
    validation errors (which carry the offending value) are described, not printed."""
    if isinstance(exc, (CliError, BundleError)):
        return one_line(exc)
    if isinstance(exc, UnicodeError):
        return f"text is not valid {getattr(exc, 'encoding', None) or 'UTF-8'} " \
               f"({getattr(exc, 'reason', None) or type(exc).__name__})"
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ == "ValidationError" and callable(errors):  # pydantic
        first = (errors(include_input=False, include_url=False) or [{}])[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        return (f"invalid {getattr(exc, 'title', 'value')}: {loc or 'value'}: "
                f"{first.get('msg', 'invalid value')}")
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename}: no such file"
    if isinstance(exc, IsADirectoryError):
        return f"{exc.filename}: is a directory"
    if isinstance(exc, PermissionError):
        return f"{exc.filename}: permission denied"
    if isinstance(exc, OSError):
        return f"{exc.filename or 'I/O'}: {exc.strerror or exc}"
    if isinstance(exc, ValueError) or type(exc).__name__ == "ApiError":
        return one_line(exc)
    return f"{type(exc).__name__}: {one_line(exc)} (EDGE_AGENT_DEBUG=1 shows a traceback)"


if __name__ == "__main__":
    sys.exit(main())
