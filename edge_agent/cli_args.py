"""argparse pieces every subcommand of ``edge-agent`` shares: the parser class (one-line
errors, exact flags) and the bundle and server flags, parsed into ``ServerOptions``."""

from __future__ import annotations

import argparse
import sys

from edge_agent.errors import PROG
from edge_agent.options import ServerOptions


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --et is not --eta: exact flags only
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line, no usage dump
        print(f"{PROG}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def add_bundle_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("bundle and server")
    g.add_argument("--bundle", metavar="DIR",
                   help="edge bundle directory (bundle.json), or a Hugging Face BERT folder; "
                        "default: the MiniLM-L6-H384 package")
    g.add_argument("--server", metavar="URL",
                   help="privbert service: its model's bundle is fetched once, cached and "
                        "verified (cache: $PRIVBERT_CACHE or ~/.cache/privbert/bundles)")
    g.add_argument("--model", metavar="ID", help="served model (GET /v1/models) to follow")
    g.add_argument("--api-key", metavar="KEY",
                   help="API key (default: $PRIVBERT_API_KEY); sent as Authorization: Bearer")
    g.add_argument("--timeout", type=float, default=30.0, help="seconds per request (30)")
    g.add_argument("--retries", type=int, default=5,
                   help="retries on 429/503/connection errors, exponential backoff (5)")


def add_ledger_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", metavar="FILE",
                   help="the privacy budget ledger (default: $PRIVBERT_LEDGER, else "
                        "ledger.sqlite3 in the user's data directory)")


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The bundle and server flags of ``args``."""
    return ServerOptions(bundle=getattr(args, "bundle", None), server=args.server,
                         model=args.model, api_key=args.api_key, timeout=args.timeout,
                         retries=args.retries)
