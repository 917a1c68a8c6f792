"""argparse pieces every subcommand of ``edge-agent`` shares: the parser class (one-line
errors, exact flags) and the bundle and server flags, parsed into ``ServerOptions``; and
those ``cloud-api``'s training commands share with it: the mechanism's parameter flags,
the dχ attack's flags, ``positive_int``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from edge_agent.errors import PROG
from edge_agent.mechanism_spec import ParamFlag, param_flags
from edge_agent.service.connect import ServerOptions


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
    from edge_agent.service.known_bundles import refuse_unverified_from_env
    from edge_agent.service.pins import parse_ids, trusted_from_env

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


def add_param_flags(group: argparse._ActionsContainer, *, with_defaults: bool,
                    mechs: Iterable[dict] | None = None, required: bool = False,
                    suffix: dict[str, str] | None = None) -> list[ParamFlag]:
    """Add one flag per parameter of ``mechs`` to ``group``. ``with_defaults``: a flag not
    given is the default its mechanisms share (``cloud-api train``); else None, so that
    the edge can tell given flags from others. ``required``: only the parameters the
    mechanisms require, each a required flag (``cloud-api pretrain``, which simulates no
    token policy). ``suffix``: more help for a parameter on this command."""
    flags = [f for f in param_flags(mechs) if f.always_required or not required]
    for f in flags:
        kwargs: dict[str, Any] = {"type": f.python_type, "help": f.help.replace("%", "%%")}
        if f.choices:
            kwargs["choices"] = f.choices
        if f.metavar:
            kwargs["metavar"] = f.metavar
        if with_defaults and f.common_default is not None:
            kwargs["default"] = f.common_default
        if required:
            kwargs["required"] = True
        if suffix and f.param in suffix:
            kwargs["help"] += f" ({suffix[f.param]})"
        group.add_argument(f.flag, **kwargs)
    return flags


def positive_int(s: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {v}")
    return v


def add_attack_flags(group: argparse._ActionsContainer, *, inversion_tokens: int,
                     target: argparse._ActionsContainer | None = None, scope: str = "") -> None:
    """The dχ attack's flags (Qu et al. §5.3), alike in ``edge-agent report`` and
    ``cloud-api evaluate --attack``: ``--target-inversion`` (added to ``target``, e.g. a
    group exclusive with ``--eta``, else to ``group``), ``--samples`` and
    ``--inversion-tokens``, whose default each command documents (``inversion_tokens``).
    ``scope``: a prefix of their help (``"dchi: "`` beside other mechanisms' flags)."""
    (target if target is not None else group).add_argument(
        "--target-inversion", type=float, metavar="P",
        help=f"{scope}find the eta whose inversion accuracy is P (within 0.01) instead of "
             "--eta, by bisection on a fixed noise draw")
    group.add_argument("--samples", type=positive_int, default=1000, metavar="K",
                       help=f"{scope}perturbations per token for N_w/S_w (1000, Qu et al. "
                            "§5.3)")
    group.add_argument("--inversion-tokens", type=positive_int, default=inversion_tokens,
                       metavar="M", help=f"{scope}token occurrences for the inversion "
                                         f"accuracy ({inversion_tokens})")
