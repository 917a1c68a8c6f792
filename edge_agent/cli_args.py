"""argparse pieces every subcommand of ``edge-agent`` shares: the parser class (one-line
errors, exact flags) and the bundle and server flags, parsed into ``ServerOptions``. The
flags it shares with ``cloud-api``'s training commands are in ``edge_agent.param_flags``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence

from edge_agent.errors import PROG
from edge_agent.service.connect import ServerOptions
from edge_agent.service.known_bundles import refuse_unverified_from_env
from edge_agent.service.pins import parse_ids, trusted_from_env


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --et is not --eta: exact flags only
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line, no usage dump
        print(f"{PROG}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


class LazyChoices(Sequence[str]):
    """argparse ``choices`` read when argparse first asks (to check a value or print the
    subcommand's help), not when the parser is built: the mechanism names come from the
    registry, which imports numpy. Give the argument a ``metavar`` (argparse formats the
    choices of one without it when it is added)."""

    def __init__(self, names: Callable[[], Sequence[str]]):
        self._names = names

    def __getitem__(self, i):
        return tuple(self._names())[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, value: object) -> bool:
        return value in self._names()


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
    g.add_argument("--accept-bundle", metavar="ID", action="append", default=[],
                   help="accept this bundle id for the model although this device pinned "
                        "another one first (a server never changes a bundle silently)")
    g.add_argument("--trusted-bundles", metavar="IDS",
                   help="comma-separated bundle ids this app trusts as they are, beside the "
                        "bundles privbert builds from public sources; any other bundle is "
                        "unverified: checked by the text floor too (default: "
                        "$PRIVBERT_TRUSTED_BUNDLES)")
    g.add_argument("--refuse-unverified", action="store_true", default=None,
                   help="refuse a bundle that is neither known nor trusted (default: "
                        "$PRIVBERT_REFUSE_UNVERIFIED=1)")


def add_ledger_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", metavar="FILE",
                   help="the privacy budget ledger (default: $PRIVBERT_LEDGER, else "
                        "ledger.sqlite3 in the user's data directory)")


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The bundle and server flags of ``args``."""

    trusted = getattr(args, "trusted_bundles", None)
    refuse = getattr(args, "refuse_unverified", None)
    return ServerOptions(bundle=getattr(args, "bundle", None), server=args.server,
                         model=args.model, api_key=args.api_key, timeout=args.timeout,
                         retries=args.retries,
                         accept_bundle=parse_ids(getattr(args, "accept_bundle", None) or [],
                                                 "--accept-bundle"),
                         trusted_bundles=(parse_ids(trusted, "--trusted-bundles")
                                          if trusted is not None else trusted_from_env()),
                         refuse_unverified=(refuse if refuse is not None
                                            else refuse_unverified_from_env()))
