"""``python -m bench.utility SUBCOMMAND …`` (see ``bench.utility``)."""

from __future__ import annotations

import sys

SUBCOMMANDS = ("table", "levers", "explore", "denoiser", "frontier")


def main(argv: list[str]) -> int:
    name, rest = (argv[0], argv[1:]) if argv[:1] and argv[0] in SUBCOMMANDS else ("table", argv)
    if argv[:1] and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        print(f"error: unknown subcommand {argv[0]!r}; one of {', '.join(SUBCOMMANDS)}",
              file=sys.stderr)
        return 2
    if name == "table":
        from bench.utility.table import main as run
    elif name == "levers":
        from bench.utility.levers import main as run
    elif name == "explore":
        from bench.utility.explore import main as run
    elif name == "frontier":
        from bench.utility.frontier import main as run
    else:
        from bench.utility.denoiser import main as run
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
