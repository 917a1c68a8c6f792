"""`cloud-api` command line. Each subcommand lives next to the code it drives and
registers itself here with ``register(subparsers)``; heavy imports happen only when
a subcommand runs."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand modules, each with register(subparsers) -> None
_COMMANDS = [
    "models.cli_train",      # train, evaluate, export-bundle
    "models.cli_pretrain",   # pretrain
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cloud-api", description="privbert server side")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency inside the module
                raise
            continue
        module.register(sub)
    for missing in ("serve", "worker", "bootstrap"):
        if missing not in sub.choices:
            p = sub.add_parser(missing, help="not implemented yet (issue #5)")
            p.set_defaults(func=_not_yet(missing))
    return parser


def _not_yet(name: str):
    def run(_args) -> int:
        print(f"cloud-api {name}: not implemented yet (the HTTP service is issue #5)",
              file=sys.stderr)
        return 2

    return run


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("cloud-api: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
