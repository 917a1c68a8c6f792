"""Adding a mechanism to the web edge touches two files (issue 45): a built-in-style module
(``tests/web_edge/toy/toy_rr.ts``, the TypeScript twin of ``tests/toy_mechanism.py``) copied
into ``src/mechanisms/``, and one entry in ``src/mechanisms/registry.ts``. The spec is
regenerated (``shared.spec``'s generator, the Python toy registered as a plugin), as it would be
for a built-in Python mechanism; generated files are not counted.

On a copy of ``web_edge`` with those changes, built with tsc: the number of source files that
differ from the repository's is counted (asserted ≤ 2), and the mechanism then works with no
other line changed: `privbert-edge privatize --mechanism toy-rr` takes its flag from the spec,
sends the Python edge's bytes for the same seed, charges the device ledger the toy's cost,
refuses an ε under its floor, and the forwarder passes its payloads.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cloud_api.test_plugin_mechanism import install_plugin
from tests.conftest import REPO
from tests.web_edge.conftest import WEB_EDGE, edge_env

pytestmark = pytest.mark.slow  # a tsc build of the whole library (~30 s on a quiet core)

TOY = Path(__file__).with_name("toy") / "toy_rr.ts"
EPSILON = 2.0
SPEC_WITH_TOY = """
from shared.mechanisms import registry
from shared.spec import build, mechanism_entry, typescript
spec = build()
spec["mechanisms"].append(mechanism_entry(registry.get("toy-rr")))
print(typescript.render(spec), end="")
"""


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.ts"))
            if "generated" not in p.relative_to(root).parts}


@pytest.fixture(scope="module")
def toy_edge(tmp_path_factory) -> tuple[Path, Path, list[str]]:
    """(the copy of web_edge with toy-rr added and built, the plugin folder, changed files)."""
    root = tmp_path_factory.mktemp("toy-edge")
    copy = root / "web_edge"
    copy.mkdir()
    for name in ("src", "bin"):
        shutil.copytree(WEB_EDGE / name, copy / name)
    for name in ("package.json", "tsconfig.json", "tsconfig.node.json", "ort-module.d.ts"):
        shutil.copy(WEB_EDGE / name, copy / name)
    (copy / "node_modules").symlink_to(WEB_EDGE / "node_modules")
    plugin = install_plugin(root / "plugin")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{plugin}"}

    # the two hand-written changes: the module, and its entry in the registry
    shutil.copy(TOY, copy / "src" / "mechanisms" / "toy_rr.ts")
    registry = copy / "src" / "mechanisms" / "registry.ts"
    text = registry.read_text()
    text = text.replace('import { ome } from "./ome.js";\n',
                        'import { ome } from "./ome.js";\nimport { toyRr } from "./toy_rr.js";\n')
    text = text.replace("  ome,\n];", "  ome,\n  toyRr,\n];")
    registry.write_text(text)
    # generated: the spec with the toy's entry (python -m shared.spec's generator)
    spec = subprocess.run([sys.executable, "-c", SPEC_WITH_TOY], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=True).stdout
    (copy / "src" / "generated" / "spec.ts").write_text(spec)

    before, after = _files(WEB_EDGE / "src"), _files(copy / "src")
    changed = sorted(f for f in after if before.get(f) != after[f])
    build = subprocess.run(["node", str(WEB_EDGE / "node_modules" / "typescript" / "bin" / "tsc"),
                            "-p", "tsconfig.node.json"], cwd=copy, capture_output=True,
                           text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:]
    return copy, plugin, changed


def test_a_new_mechanism_touches_two_files(toy_edge):
    _, _, changed = toy_edge
    assert changed == ["mechanisms/registry.ts", "mechanisms/toy_rr.ts"]
    assert len(changed) <= 2


def _run(cmd: list[str], tmp: Path, plugin: Path) -> subprocess.CompletedProcess:
    env = edge_env(tmp, {"PYTHONPATH": f"{REPO}:{plugin}"})
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_the_added_mechanism_works_end_to_end(toy_edge, tiny_dir, tmp_path):
    copy, plugin, _ = toy_edge
    cli = ["node", str(copy / "bin" / "privbert-edge.js")]
    usage = _run([*cli, "--help"], tmp_path, plugin)
    assert "toy-rr" in usage.stderr and "--epsilon" in usage.stderr

    inp = tmp_path / "in.txt"
    inp.write_text("a good fun movie\nan awful dull plot that never ends\nyes\n")
    args = ["privatize", str(inp), "--mechanism", "toy-rr", "--epsilon", str(EPSILON),
            "--bundle", str(tiny_dir), "--seed", "7"]
    js = _run([*cli, *args, "-o", str(tmp_path / "js.jsonl")], tmp_path, plugin)
    assert js.returncode == 0, js.stderr
    py = _run([sys.executable, "-m", "edge_agent", *args, "-o", str(tmp_path / "py.jsonl")],
              tmp_path, plugin)
    assert py.returncode == 0, py.stderr
    sent = (tmp_path / "js.jsonl").read_bytes()
    assert sent == (tmp_path / "py.jsonl").read_bytes()  # the Python edge's bytes, seed for seed

    payloads = [json.loads(line)["payload"] for line in sent.decode().splitlines()]
    assert {p["mechanism"] for p in payloads} == {"toy-rr"}
    tokens = sum(p["token_ids"]["shape"][0] for p in payloads)
    budget = _run([*cli, "budget"], tmp_path, plugin)
    spent = json.loads(budget.stdout)
    assert spent["families"]["randomized-response"]["tokens"] == tokens
    assert spent["spent"] == pytest.approx(EPSILON * tokens, rel=1e-12)

    # its floor: an epsilon that keeps nearly every token is refused, exit 2
    weak = _run([*cli, "privatize", str(inp), "--mechanism", "toy-rr", "--epsilon", "40",
                 "--bundle", str(tiny_dir)], tmp_path, plugin)
    assert weak.returncode == 2 and "weaker than the privacy floor" in weak.stderr

    # the forwarder passes its payloads, from the spec's shape, with no line of it changed
    module = json.dumps(str(copy / "dist" / "forwarder.js"))
    check = (f"import {{ payloadBody }} from {module}; "
             "process.stdout.write(payloadBody(process.argv[1]));")
    fwd = subprocess.run(["node", "--input-type=module", "-e", check,
                          json.dumps({"payloads": payloads})], capture_output=True, text=True,
                         timeout=60)
    assert fwd.returncode == 0, fwd.stderr
    assert json.loads(fwd.stdout)["payloads"] == payloads
