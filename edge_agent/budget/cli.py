"""``edge-agent budget``: what this device has spent, per family and in total, and its caps."""

from __future__ import annotations

import argparse
import json
import math

from edge_agent.budget.ledger import DeviceLedger
from edge_agent.cli_args import add_ledger_arg
from edge_agent.errors import UsageError
from shared.conventions import fmt_eps as fmt

PER_DAY_NOTE = ("a daily cap is not a lifetime bound: over d days the device may spend up to "
                "d times it; only --cap bounds everything it ever sends")
DESCRIPTION = """\
Every payload edge-agent privatize writes or sends is charged to this device's ledger, in
the units of its guarantee (dχ: eta*n per sentence of n tokens; laplace, ome: epsilon),
and in one total of worst-case epsilon (dχ: eta*n*D, D the largest distance between two
tokens of the bundle's table), summed over every send (sequential composition). TextHide
and none have no epsilon: their sends are counted. There is no cap until one is set, but
everything is counted."""


def register(sub) -> None:
    p = sub.add_parser("budget", help="privacy spent by this device, and its cap",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print as JSON (spent, cap, remaining "
                   "and sends in worst-case epsilon for the total; per family below)")
    p.add_argument("--cap", metavar="EPS", help="set a lifetime cap in worst-case epsilon "
                   "(none: remove it); edge-agent privatize refuses a run that would pass it")
    p.add_argument("--per-day", metavar="EPS", help="set a cap on what any 24 hours may spend "
                   f"(none: remove it); {PER_DAY_NOTE}")
    add_ledger_arg(p)
    p.set_defaults(func=run)


def parse_cap(flag: str, text: str | None) -> float | None:
    """A cap given on the command line: a finite number >= 0, or "none"."""
    if text is None or text.strip().lower() == "none":
        return None
    try:
        v = float(text)
    except ValueError:
        raise UsageError(f"{flag} takes a number of worst-case epsilon or 'none', "
                         f"got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise UsageError(f"{flag} must be a finite number >= 0 (or 'none'), got {text}")
    return v


def run(args: argparse.Namespace) -> int:
    changes = [(name, parse_cap(flag, text)) for name, flag, text in
               (("cap", "--cap", args.cap), ("per_day", "--per-day", args.per_day))
               if text is not None]
    # nothing to change: a ledger this user cannot write is read as it is
    with DeviceLedger.open(args.ledger, read_only_ok=not changes) as ledger:
        for name, value in changes:
            ledger.set_cap(name, value)
        st = ledger.status()
    if args.json:
        print(json.dumps(st.to_json()))
    else:
        print(format_status(st))
    return 0


def format_status(st) -> str:
    lines = [f"ledger: {st.path}", f"{'family':<22}{'worst-case eps':>16}{'sends':>9}  detail"]
    for name, f in sorted(st.spend.families.items()):
        detail = ""
        if name == "dchi":
            detail = f"eta*n = {fmt(f.metric)} over {f.tokens:,} tokens"
            if f.public:
                detail += (f"; {f.public:,} public words sent under a token policy (no "
                           "guarantee, not charged)")
        elif f.epsilon is None:
            detail = "no differential-privacy guarantee: sends counted"
        eps = "-" if f.epsilon is None else fmt(f.epsilon)
        lines.append(f"{name:<22}{eps:>16}{f.sends:>9,}  {detail}")
    lines.append(f"{'total':<22}{fmt(st.spent):>16}{st.spend.sends:>9,}")
    if st.cap is None:
        lines.append("cap: none (everything is counted; edge-agent budget --cap EPS sets one)")
    else:
        lines.append(f"cap: {fmt(st.cap)}, remaining {fmt(st.remaining)}")
    if st.per_day is not None:
        lines.append(f"per-day cap: {fmt(st.per_day)} in any 24 hours (spent in the last 24 "
                     f"hours: {fmt(st.day_spent)}); {PER_DAY_NOTE}")
    lines.append(f"memoized texts: {st.memoized:,} (a repeat sends the stored payload at no "
                 "cost; the server can tell that two sends were the same text)")
    return "\n".join(lines)
