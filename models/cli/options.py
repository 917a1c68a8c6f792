"""A command line's namespace as typed options: each ``cloud-api`` command parses its flags
once into a frozen dataclass (``options_of``), at its entry, and the code below it takes that
object or plain values, never an ``argparse.Namespace`` (as ``edge-agent privatize`` does:
``edge_agent.privatize.options``). Standard library only: ``cloud-api serve`` imports it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

OptionsT = TypeVar("OptionsT", bound="DataclassInstance")
T = TypeVar("T")


def options_of(cls: type[OptionsT], args: argparse.Namespace, **given: Any) -> OptionsT:
    """``cls`` with each field the namespace's value of the same name, unless ``given``
    (sub-options, or a value the flags spell differently); a field the namespace lacks is
    a KeyError: a flag and its option are named alike."""
    values = vars(args)
    return cls(**{f.name: given[f.name] if f.name in given else values[f.name]
                  for f in fields(cls)})


def parsed(cls: type[OptionsT]) -> Callable[[argparse.Namespace], OptionsT]:
    """``options_of(cls, ·)``: the parser of a command whose flags are its options' fields."""
    return lambda args: options_of(cls, args)


def entry(fn: Callable[[T], int], parse: Callable[[argparse.Namespace], T],
          expected: tuple[type[BaseException], ...], fail: Callable[[BaseException], int]
          ) -> Callable[[argparse.Namespace], int]:
    """A command's entry: its flags parsed once into options (``parse``), then
    ``fn(options)``; an ``expected`` failure (bad flags, a missing folder, an unusable
    bundle) goes to ``fail``, which says it in one line and returns the exit code."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(parse(args))
        except expected as exc:
            return fail(exc)

    return run
