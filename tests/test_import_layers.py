"""The import graph of `shared` and `edge_agent`: no circles, and each layer imports only
below itself. Every import counts (module level, inside functions, lazy), except those
under ``if TYPE_CHECKING:``; read from the source with ast, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("shared", "edge_agent")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """Project modules imported by ``path`` (``from a.b import c``: ``a.b.c`` when that is a
    module, else ``a.b``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out.add(full if full in known else node.module)
    me = module_name(path)
    return {m for m in out if m in known and m != me}


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    known = {module_name(p) for p in files}
    return {module_name(p): imports(p, known) for p in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_mechanisms_import_neither_the_floor_nor_the_ledger():
    """The floor, the ledger and the accounting register each mechanism's functions in the
    registry (``shared.mechanisms.registry``); the payload union is built from it."""
    g = graph()
    above = {"shared.floor", "shared.accounting", "shared.ledger", "shared.payload"}
    mechanisms = [mod for mod in g if mod.startswith("shared.mechanisms")]
    assert "shared.mechanisms.registry" in mechanisms
    for mod in mechanisms:
        assert not deps_of(g, mod) & above, (mod, deps_of(g, mod) & above)


def deps_of(g: dict[str, set[str]], mod: str) -> set[str]:
    """Every module ``mod`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [mod]
    while todo:
        for dep in g[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def test_nothing_below_the_command_line_imports_it_or_argparse():
    cli = {"edge_agent.cli", "edge_agent.cli_args", "edge_agent.cli_privatize",
           "edge_agent.cli_budget", "edge_agent.__main__"}
    g = graph()
    for mod, deps in g.items():
        if mod.startswith("edge_agent") and mod not in cli:
            assert not deps & cli, (mod, deps & cli)
            src = (REPO / (mod.replace(".", "/") + ".py"))
            if src.exists():
                assert "argparse" not in {n.split(".")[0] for n in _stdlib_imports(src)}, mod


def _stdlib_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names
