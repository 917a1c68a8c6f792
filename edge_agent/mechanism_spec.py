"""The mechanisms as the command lines see them, from the mechanism spec: names, payload
kinds, and one flag per parameter of a mechanism's typed ``Params`` (``--word-dropout`` for
``word_dropout``) with its type, choices and help, shared by every mechanism that has the
parameter. ``edge-agent privatize`` and the training command lines (``cloud-api train``,
``evaluate``, ``bootstrap``, ``pretrain``) add the flags with
``edge_agent.param_flags.add_param_flags``; none lists a mechanism's parameters.

The built-in mechanisms come from ``shared/spec/mechanisms.json``, read as JSON without
importing ``shared`` (which loads numpy), so that building a parser stays light; a plugin's
mechanisms (entry points of ``privbert.mechanisms``) are added from the registry itself,
only where a plugin is installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

PLUGIN_GROUP = "privbert.mechanisms"  # shared.mechanisms.registry.PLUGIN_GROUP
_TYPES = {"number": float, "integer": int, "string": str}


def spec_path() -> Path:
    """``shared/spec/mechanisms.json`` of the installed ``shared`` package (not imported)."""
    found = find_spec("shared")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError("the shared package is not installed")
    return Path(next(iter(found.submodule_search_locations))) / "spec" / "mechanisms.json"


@cache
def spec() -> dict:
    return json.loads(spec_path().read_text(encoding="utf-8"))


def _has_plugins() -> bool:
    from importlib.metadata import entry_points

    return bool(entry_points(group=PLUGIN_GROUP))


@cache
def entries() -> tuple[dict, ...]:
    """Each mechanism's spec: the built-in ones, then those of installed plugins."""
    own = list(spec()["mechanisms"])
    if _has_plugins():
        # lazy: numpy, only when a plugin is installed (the parser stays light)
        from shared.mechanisms import registry
        from shared.spec import mechanism_entry

        known = {e["name"] for e in own}
        own += [mechanism_entry(c) for c in registry.mechanisms() if c.name not in known]
    return tuple(own)


def entry(name: str) -> dict:
    """The spec of the mechanism ``name`` (KeyError for an unknown one)."""
    for e in entries():
        if e["name"] == name:
            return e
    raise KeyError(name)


def names() -> tuple[str, ...]:
    return tuple(e["name"] for e in entries())


@dataclass(frozen=True)
class ParamFlag:
    """One flag for a parameter name, over every mechanism that has it."""

    param: str
    flag: str
    json_type: str  # number, integer, string
    choices: tuple[str, ...] | None
    metavar: str | None
    mechanisms: tuple[str, ...]
    helps: tuple[tuple[str, str], ...]  # (mechanism, its help) in order
    defaults: tuple[Any, ...]  # each mechanism's default (None: required)
    requireds: tuple[bool, ...] = ()  # whether each mechanism requires it

    @property
    def always_required(self) -> bool:
        """Every mechanism with this parameter requires it (eta; not public_p)."""
        return bool(self.requireds) and all(self.requireds)

    @property
    def help(self) -> str:
        """"dchi-text, dchi-embedding: dχ-privacy eta > 0" (mechanisms with the same help
        share one clause)."""
        groups: dict[str, list[str]] = {}
        for mech, text in self.helps:
            groups.setdefault(text, []).append(mech)
        return "; ".join(f"{', '.join(m)}: {t}" for t, m in groups.items())

    @property
    def common_default(self) -> Any:
        """The default every mechanism with this parameter has, else None."""
        return self.defaults[0] if len(set(map(repr, self.defaults))) == 1 else None

    @property
    def python_type(self) -> type:
        return _TYPES[self.json_type]


def param_flags(mechs: Iterable[dict] | None = None) -> list[ParamFlag]:
    """The flags of ``mechs`` (default: every mechanism), in the order the parameters first
    appear; ValueError when two mechanisms give one parameter name different types."""
    by: dict[str, dict] = {}
    for e in (entries() if mechs is None else mechs):
        for f in e["flags"]:
            got = by.setdefault(f["param"], {"flag": f, "mechs": [], "helps": [],
                                             "defaults": [], "requireds": []})
            first = got["flag"]
            if (first["type"], first["choices"]) != (f["type"], f["choices"]):
                raise ValueError(f"parameter {f['param']} of {e['name']} has another type than "
                                 f"that of {got['mechs'][0]}: one flag cannot take both")
            got["mechs"].append(e["name"])
            got["helps"].append((e["name"], f["help"]))
            got["defaults"].append(f["default"])
            got["requireds"].append(bool(f.get("required", False)))
    return [ParamFlag(p, g["flag"]["flag"], g["flag"]["type"],
                      tuple(g["flag"]["choices"]) if g["flag"]["choices"] else None,
                      g["flag"]["metavar"], tuple(g["mechs"]), tuple(g["helps"]),
                      tuple(g["defaults"]), tuple(g["requireds"]))
            for p, g in by.items()]


def flag_values(values: dict, mechs: Iterable[dict] | None = None) -> dict[str, Any]:
    """The parsed value of every parameter flag in ``values`` (an argparse namespace's
    ``vars``; None: not given), by parameter name."""
    return {f.param: values.get(f.param) for f in param_flags(mechs)}
