"""The edge agent's errors and one-line messages (no argparse, no heavy imports).

Every module below the command line raises these; ``edge_agent.cli.main`` turns them into
one line ``edge-agent: error: ...`` on stderr and an exit code: 2 for usage (bad flags or
parameters), 3 when the privacy budget refuses a run, 1 for any other run-time failure.
"""

from __future__ import annotations

import sys

PROG = "edge-agent"


class UsageError(Exception):
    """Bad flags or parameters: exit code 2."""


class CliError(Exception):
    """A run-time failure with a message that says what to do: exit code 1."""


class BudgetRefused(CliError):
    """The privacy budget ledger refuses the run (spent + needed would pass the cap):
    exit code 3."""


def one_line(exc: BaseException, limit: int | None = None) -> str:
    """The first lines of an exception's message joined into one, for every command line
    and job error of the project: a problem's ``detail`` when it has one, a missing key
    named as such, at most ``limit`` characters."""
    detail = getattr(exc, "detail", None)
    text = detail if isinstance(detail, str) and detail else str(exc)
    text = text or type(exc).__name__
    if isinstance(exc, KeyError):
        text = f"missing key {text}"
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    joined = "; ".join(" ".join(s.split()) for s in lines[:3])
    return joined[:limit] if limit is not None else joined


def warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def info(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)
