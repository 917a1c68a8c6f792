"""argparse flags every command line shares, ``edge-agent``'s and ``cloud-api``'s training
commands alike: one flag per parameter of a mechanism (from the spec, without numpy), the dχ
attack's flags, ``positive_int``. No command lives here: the training commands import it
without importing the edge's CLI."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from edge_agent.mechanism_spec import ParamFlag, param_flags


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
