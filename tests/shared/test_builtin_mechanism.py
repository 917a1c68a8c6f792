"""A built-in mechanism takes two files in Python (ARCHITECTURE.md "Adding a mechanism"):
its module in ``shared/mechanisms/``, holding its sampler, cost, floor and guarantee, and
one ``register`` line in ``shared/mechanisms/__init__.py``. The test copies ``shared/``,
adds the toy mechanism (``tests/toy_mechanism.py``, k-ary randomized response) as a
built-in one, counts the files that differ from the product's, and runs it in a fresh
interpreter on the copy: the registry, the ledger, the floor, the accounting, the payload
union and the spec all know it."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PROBE = """
import json, sys
import numpy as np
import shared
assert shared.__file__.startswith(sys.argv[1]), shared.__file__
from shared import accounting, floor, ledger, payload, spec
from shared.bundle import EdgeBundle
from shared.mechanisms import registry
b = EdgeBundle.load(sys.argv[2])
ok, weak = (registry.create("toy-rr", {"epsilon": e}, b) for e in (2.0, 50.0))
p = payload.make_payload("toy-rr", {"epsilon": 2.0}, b.bundle_id,
                         ok.privatize_tokens(np.array([5, 6, 7]), b, np.random.default_rng(0)))
print(json.dumps({
    "names": list(registry.names()),
    "cost": ledger.payload_cost(p).epsilon,
    "family": ledger.family_of("toy-rr"),
    "passes": floor.weak_privacy_reason(ok, b),
    "refused": floor.weak_privacy_reason(weak, b),
    "guarantee": accounting.guarantee(ok)["worst_case"]["epsilon"],
    "in_spec": "toy-rr" in [m["name"] for m in spec.build()["mechanisms"]],
}))
"""


def differing(a: Path, b: Path) -> list[str]:
    """Files of tree ``b`` that are new or differ from ``a`` (paths relative to ``b``)."""
    out: list[str] = []

    def walk(cmp: filecmp.dircmp, rel: Path) -> None:
        out.extend(str(rel / f) for f in cmp.right_only + cmp.diff_files)
        for name, sub in cmp.subdirs.items():
            walk(sub, rel / name)

    walk(filecmp.dircmp(a, b, ignore=["__pycache__"]), Path(b.name))
    return sorted(out)


def test_a_built_in_mechanism_is_its_module_and_one_register_line(tiny_bundle, tmp_path):
    root = tmp_path / "copy"
    root.mkdir()
    shutil.copytree(REPO / "shared", root / "shared",
                    ignore=shutil.ignore_patterns("__pycache__"))
    mechs = root / "shared" / "mechanisms"
    shutil.copy(REPO / "tests" / "toy_mechanism.py", mechs / "toy_rr.py")
    init = mechs / "__init__.py"
    src = init.read_text(encoding="utf-8")
    assert "register(TextHide)\n" in src
    init.write_text(src.replace(
        "from shared.mechanisms.texthide import TextHide\n",
        "from shared.mechanisms.texthide import TextHide\n"
        "from shared.mechanisms.toy_rr import ToyRR\n").replace(
        "register(TextHide)\n", "register(TextHide)\nregister(ToyRR)\n"), encoding="utf-8")
    assert differing(REPO / "shared", root / "shared") == [
        "shared/mechanisms/__init__.py", "shared/mechanisms/toy_rr.py"]

    bundle_dir = tiny_bundle.save(tmp_path / "bundle")
    run = subprocess.run([sys.executable, "-c", PROBE, str(root), str(bundle_dir)],
                         cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout)
    assert got["names"][-1] == "toy-rr"
    assert got["cost"] == 2.0 * 3 and got["family"] == "randomized-response"
    assert got["passes"] is None and "weaker than the privacy floor" in got["refused"]
    assert got["guarantee"] == 2.0 and got["in_spec"]


def test_each_built_in_mechanism_registers_its_analysis_in_its_own_module():
    """The product's mechanisms are written so too: each one's cost, floor, computability
    check and guarantee are defined in its own module (a mechanism without an ε registers
    the ledger's generic ``counted``; one that cannot overflow has the default check)."""
    from shared import ledger
    from shared.mechanisms import registry

    built_in = [c for c in registry.mechanisms() if c.__module__.startswith("shared.")]
    assert {c.name for c in built_in} >= {"dchi-text", "dchi-embedding", "laplace", "ome",
                                          "texthide", "none"}
    for cls in built_in:
        for aspect in (registry.COST, registry.FLOOR, registry.GUARANTEE,
                       registry.COMPUTABLE):
            fn = aspect.of(cls)
            if fn is aspect.default or fn is ledger.counted:
                continue
            assert fn.__module__ == cls.__module__, (cls.name, aspect.what, fn.__module__)
