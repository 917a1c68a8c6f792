"""``edge-agent privatize``: its flags, parsed once into a
:class:`~edge_agent.privatize.options.PrivatizeOptions` for ``edge_agent.privatize.run``."""

from __future__ import annotations

import argparse

from edge_agent.cli_args import (
    LazyChoices,
    add_bundle_args,
    add_ledger_arg,
    server_options,
)
from edge_agent.mechanism_spec import flag_values
from edge_agent.param_flags import add_param_flags
from edge_agent.privatize.options import (
    DEFAULT_MECHANISM,
    InputOptions,
    LedgerOptions,
    MechanismOptions,
    PostOptions,
    PrivatizeOptions,
    mechanisms,
    options_of,
)
from edge_agent.privatize.run import run as run_privatize
from edge_agent.privatize.texthide_key import KEY_ENV, MAKE_ONE

EPILOG = """\
input: one record per line (UTF-8). With --tsv: text<TAB>label or text_a<TAB>text_b<TAB>label
  (a first line whose last column is "label" is a header and skipped, see --header).
output: one JSON record per line, {"payload": {...}, "label": ...} (shared.payload.Record);
  no label field without labels. --format text prints privatized text (dchi-text only).
policies: empty lines are skipped and counted (--empty error refuses them); a text longer
  than the model's limit (max_length - 2 word pieces, - 3 for a pair) keeps its first
  word pieces, a pair trims its longer segment first (--truncate error refuses it).
  A bad line stops the run with one message naming it; records before it are kept.
privacy budget: every payload is charged to the device's ledger (edge-agent budget) before
  it is written or sent. With a cap set, the whole input is read and its cost computed
  first, and a run that would pass the cap is refused with exit code 3, before anything is
  written or sent. The same text with the same mechanism, parameters and bundle gets the
  payload stored the first time (byte for byte, at no cost; --no-memo draws afresh).
randomness: fresh OS entropy for every batch. --seed makes runs reproducible and the
  noise predictable: anyone who knows the seed can remove the protection.
texthide key: the secret mask pool comes from --texthide-key (or $PRIVBERT_TEXTHIDE_KEY),
  at least 32 hex digits (128 bits); without one, each run draws a new pool. Make one with:
    """ + MAKE_ONE + "\n"


def register(sub) -> None:
    p = sub.add_parser("privatize", help="privatize text, one record per line",
                       description="Privatize text on this device; only payloads leave it.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="input file, one record per line; - for stdin")
    p.add_argument("--tsv", action="store_true",
                   help="text<TAB>label or text_a<TAB>text_b<TAB>label")
    p.add_argument("--header", choices=("auto", "yes", "no"), default="auto",
                   help="TSV header line: auto = skipped when its last column is 'label'")
    p.add_argument("-o", "--output", metavar="OUT.jsonl", help="output file (default stdout)")
    p.add_argument("--format", choices=("jsonl", "text"), default="jsonl",
                   help="jsonl records (default) or, for dchi-text, the privatized text")
    m = p.add_argument_group("mechanism")
    m.add_argument("--mechanism", choices=LazyChoices(mechanisms), default=DEFAULT_MECHANISM,
                   metavar="NAME", help="%(choices)s; default dchi-text; none sends plain "
                   "token ids (needs --allow-none)")
    # one flag per parameter of the mechanisms' Params (edge_agent.mechanism_spec)
    add_param_flags(m, with_defaults=False, suffix={"k": "default 1; k > 1 needs --tsv labels"})
    m.add_argument("--texthide-key", metavar="HEX",
                   help=f"texthide: the client's secret mask-pool key, >= 32 hex digits "
                        f"(or ${KEY_ENV})")
    m.add_argument("--texthide-seed", metavar="HEX",
                   help="deprecated alias of --texthide-key (the same check)")
    m.add_argument("--num-labels", type=int, help="texthide k > 1: classes of the soft "
                   "labels (default 2)")
    m.add_argument("--float16", action="store_true", help="dchi-embedding: send float16")
    m.add_argument("--allow-none", action="store_true",
                   help="allow --mechanism none (plain ids: the server can read the text)")
    m.add_argument("--allow-weak-privacy", action="store_true",
                   help="privatize even with parameters weaker than the privacy floor "
                        "(shared.floor: output close to the raw text); refused otherwise")
    m.add_argument("--seed", type=int, help="seed the noise (reproducible; removes protection)")
    i = p.add_argument_group("input policies")
    i.add_argument("--empty", choices=("skip", "error"), default="skip",
                   help="empty lines: skip and count (default) or stop with an error")
    i.add_argument("--truncate", choices=("first", "error"), default="first",
                   help="over-long text: keep the first word pieces (default) or stop")
    i.add_argument("--max-length", type=int, metavar="N",
                   help="model length limit incl. [CLS]/[SEP] (default: the bundle's)")
    i.add_argument("--batch-size", type=int, default=256, help="lines per batch (256)")
    i.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = p.add_argument_group("posting")
    s.add_argument("--post", choices=("predict", "records"),
                   help="predict: one JSON prediction per line (needs --server, --model); "
                        "records: upload labelled records (needs --server, --task, --tsv)")
    s.add_argument("--task", help="task name for --post records")
    s.add_argument("--post-batch", type=int, default=64, help="payloads per request (64)")
    b = p.add_argument_group("privacy budget")
    add_ledger_arg(b)
    b.add_argument("--no-memo", action="store_true",
                   help="fresh draws for texts sent before (each one charged) instead of "
                        "their stored payloads")
    b.add_argument("--dry-run", action="store_true",
                   help="print what the input would cost and whether it fits the cap; "
                        "spends, writes and sends nothing")
    add_bundle_args(p)
    p.set_defaults(func=run)


def options(args: argparse.Namespace) -> PrivatizeOptions:
    """The parsed flags as typed options (the only place that reads the namespace)."""
    v = vars(args)
    return PrivatizeOptions(
        file=args.file, output=args.output, format=args.format,
        mechanism=options_of(MechanismOptions, {**v, "name": args.mechanism,
                                                "values": flag_values(v)}),
        input=options_of(InputOptions, {**v, "progress": not args.no_progress}),
        post=PostOptions(mode=args.post, task=args.task, batch=args.post_batch),
        server=server_options(args),
        ledger=LedgerOptions(path=args.ledger, memo=not args.no_memo, dry_run=args.dry_run))


def run(args: argparse.Namespace) -> int:
    return run_privatize(options(args))
