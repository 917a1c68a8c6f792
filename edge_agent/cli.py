"""`edge-agent` command line (privatize, report, bundle)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("edge-agent: not implemented yet (issue #3: privatize, report, bundle)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
