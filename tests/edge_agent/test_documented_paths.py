"""The Python paths the documentation gives users resolve: every ``edge_agent.x.y`` and
``from edge_agent... import N`` written in README.md, ARCHITECTURE.md and docs/, and the
paths of earlier releases that users were told to import."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]
# documented before the edge's modules moved into subpackages: they must keep working
EARLIER = ["edge_agent.Privatizer"]


def resolve(path: str) -> object:
    """The module or attribute a dotted path names (ImportError / AttributeError if none)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def documented() -> list[str]:
    """Dotted paths in the docs (``edge_agent.a.b``; ``edge_agent/a/b.py`` file names too)."""
    found: set[str] = set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        found.update(re.findall(r"\bedge_agent(?:\.\w+)+", text))
        found.update(p.replace("/", ".") for p in re.findall(r"\bedge_agent(?:/\w+)+(?=\.py)",
                                                             text))
        for mod, names in re.findall(r"from (edge_agent[\w.]*) import ([\w, ]+)", text):
            found.update(f"{mod}.{n.strip()}" for n in names.split(","))
    return sorted(found)


def test_the_docs_name_edge_agent_paths():
    assert "edge_agent.Privatizer" in documented()  # the finder reads the docs


@pytest.mark.parametrize("path", sorted(set(documented()) | set(EARLIER)))
def test_a_documented_path_resolves(path):
    assert resolve(path) is not None


def test_the_kept_paths_are_the_same_objects():
    from edge_agent.privatize.privatizer import Privatizer

    assert resolve("edge_agent.Privatizer") is Privatizer
