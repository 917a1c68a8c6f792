"""`cloud-api` command line (serve, worker, bootstrap, pretrain, train, export-bundle, evaluate)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("cloud-api: not implemented yet (issues #4 and #5)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
