"""The privacy floor, the bundle checks and bundle pinning of issues 33 and 34 in both edges.

* For a seeded generator, `@privbert/edge`'s floor (tests/web_edge/floor_reason.mjs) and
  `shared.floor.weak_privacy_reason` draw the same tokens, noise and pairs and give the same
  decision and message, on every kind of table and on the hostile tables.
* The hostile bundles of issue 34 (tests/edge_agent/test_hostile_bundle.py) are refused by the
  real `privbert-edge` as by `edge-agent`: exit 2, one line, nothing written, nothing charged
  (each edge draws with OS entropy: the figures in the lines differ, the rest does not).
* A designed table that does not match its description is refused in the same line by both.
* A served model whose bundle changes is refused by both before any of the new bundle is
  fetched; the two edges share one pins.json.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.edge_agent.conftest import FakeServer
from tests.edge_agent.test_hostile_bundle import hostile
from tests.edge_agent.test_server_paths import serve_model
from tests.web_edge.conftest import js_edge, py_edge
from tests.web_edge.test_conformance import write_lines

FLOOR_JS = Path(__file__).with_name("floor_reason.mjs")
START = re.compile(r"starts near eta=[\d.e+-]+|inf\)")
NUMBERS = re.compile(r"\d[\d,.]*%?")
SENTENCES = ["a gripping , funny film", "the plot is thin and the acting worse"]


def js_floor(bundle_dir: Path, seed: int, mechanism: str, *etas: float,
             policy: bool = False, measured: list | None = None) -> list[str | None]:
    """The web edge's floor reasons (and, into ``measured``, measureUnchanged's counts)."""
    env = {**os.environ, "FLOOR_POLICY": "1" if policy else "0"}
    p = subprocess.run(["node", str(FLOOR_JS), str(bundle_dir), str(seed), mechanism,
                        *map(repr, etas)], cwd=REPO, capture_output=True, text=True, timeout=900,
                       env=env)
    assert p.returncode == 0, p.stderr
    out = [json.loads(x) for x in p.stdout.splitlines()]
    assert all(o["error"] is None for o in out), out
    if measured is not None:
        measured += [tuple(o["measured"]) for o in out]
    return [o["reason"] for o in out]


def py_floor(bundle, seed: int, mechanism: str, eta: float, public_p: float | None = None
             ) -> str | None:
    from shared.floor import weak_privacy_reason
    from shared.mechanisms import DChiEmbedding, DChiText

    mech = DChiText(bundle, eta, public_p=public_p) if mechanism == "dchi-text" else \
        DChiEmbedding(eta, public_p=public_p, bundle=bundle)
    return weak_privacy_reason(mech, bundle, rng=np.random.default_rng(seed))


@pytest.mark.parametrize(("table", "mechanism", "etas"), [
    ("none", "dchi-text", (65.0, 1e4)),
    ("none", "dchi-embedding", (1e4,)),
    ("pca32-int8", "dchi-text", (65.0, 200.0, 1e4)),  # 200: near its floor, 2,048 tokens drawn
    ("pca64", "dchi-text", (65.0, 1e4)),
])
def test_a_seeded_floor_gives_the_python_edges_decision_and_message(table_dirs, table, mechanism,
                                                                      etas):
    from shared.bundle import EdgeBundle

    bundle = EdgeBundle.load(table_dirs[table])
    got = js_floor(table_dirs[table], 7, mechanism, *etas)
    want = [py_floor(bundle, 7, mechanism, eta) for eta in etas]
    assert got == want
    assert want[-1] is not None and (len(etas) == 1 or want[0] is None)  # refused; 65 passes
    if table == "pca32-int8":
        assert "of 2,048 tokens drawn at random" in want[1]


def test_a_seeded_floor_under_a_token_policy_gives_the_python_edges_message(policy_dir):
    """Under a token policy the floor judges the words outside the public list: both edges
    draw them from the same generator and count the same unchanged tokens."""
    from shared.bundle import EdgeBundle
    from shared.floor import measure_unchanged
    from shared.mechanisms import DChiText

    bundle = EdgeBundle.load(policy_dir)
    counts: list = []
    got = js_floor(policy_dir, 9, "dchi-text", 42.0, policy=True, measured=counts)
    assert got == [py_floor(bundle, 9, "dchi-text", 42.0, public_p=0.3)] == [None]
    # the tokens drawn are the words outside the list: at eta 42 (about half come back) the
    # count of the first step tells another token set apart (a refusal's message is the one
    # without a policy, test above)
    mech = DChiText(bundle, 42.0, public_p=0.3)
    assert counts[0] == measure_unchanged(mech, bundle, rng=np.random.default_rng(9))
    assert counts[0] != measure_unchanged(DChiText(bundle, 42.0), bundle,
                                          rng=np.random.default_rng(9))


@pytest.fixture(scope="module")
def hostile_dirs(minilm_bundle, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile-web")
    return {name: b.save(root / name) for name, b in {
        "copies": hostile(minilm_bundle),
        "scaled": hostile(minilm_bundle, copies=False),
        "near-copies": hostile(minilm_bundle, jitter=1e-4),
    }.items()}


@pytest.mark.parametrize(("variant", "why"), [
    ("copies", "identical rows"),
    ("near-copies", "near-duplicate rows"),
    ("scaled", "tokens drawn at random came back unchanged"),
])
def test_hostile_bundles_are_refused_by_both_edges(hostile_dirs, tmp_path, variant, why):
    from shared.bundle import EdgeBundle

    # seeded: the same message from both
    want = py_floor(EdgeBundle.load(hostile_dirs[variant]), 5, "dchi-text", 65.0)
    assert js_floor(hostile_dirs[variant], 5, "dchi-text", 65.0) == [want]
    assert why in want
    # the command lines, with OS entropy: refused, nothing written, nothing charged
    inp = tmp_path / "in.txt"
    write_lines(inp, SENTENCES)
    lines = {}
    for prog, run, extra in (("privbert-edge", js_edge, []), ("edge-agent", py_edge, ["--no-progress"])):
        out = tmp_path / f"{prog}.jsonl"
        p = run("privatize", str(inp), "--eta", "65", "--bundle", str(hostile_dirs[variant]),
                "-o", str(out), *extra, tmp=tmp_path)
        assert p.returncode == 2, p.stderr
        assert p.stdout == "" and not out.exists()
        errors = [ln for ln in p.stderr.splitlines() if ln.startswith(f"{prog}: error: ")]
        assert len(errors) == 1 and why in errors[0], p.stderr
        lines[prog] = errors[0].removeprefix(f"{prog}: error: ")
    assert json.loads(js_edge("budget", tmp=tmp_path).stdout)["spent"] == 0
    js_line, py_line = (NUMBERS.sub("N", START.sub("X", lines[p]))
                        for p in ("privbert-edge", "edge-agent"))
    assert js_line == py_line


def test_dchi_embedding_on_a_designed_table_is_refused_alike(table_dirs, tmp_path):
    inp = tmp_path / "in.txt"
    write_lines(inp, SENTENCES)
    args = ["privatize", str(inp), "--mechanism", "dchi-embedding", "--eta", "65", "--bundle",
            str(table_dirs["pca32-int8"])]
    js = js_edge(*args, tmp=tmp_path)
    py = py_edge(*args, "--no-progress", tmp=tmp_path)
    assert js.returncode == py.returncode == 1, js.stderr + py.stderr
    assert js.stderr == py.stderr.replace("edge-agent", "privbert-edge")
    assert "serves dchi-text only" in js.stderr and js.stdout == ""


def _rewrite(src: Path, dst: Path, change) -> Path:
    """A copy of the bundle directory ``src`` with ``change(meta, dir)`` applied, its file
    hashes and bundle_id recomputed (a server signs what it likes)."""
    import shutil

    from shared.bundle import EdgeBundle, _sha256

    shutil.copytree(src, dst)
    meta = json.loads((dst / "bundle.json").read_text())
    change(meta, dst)
    meta["files"] = {n: _sha256((dst / n).read_bytes()) for n in sorted(meta["files"])}
    meta["bundle_id"] = EdgeBundle._compute_id(meta)
    (dst / "bundle.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return dst


def _as_int8(meta, d):
    meta["table"].update(dtype="int8", scale_file="table_scale.npy")
    np.save(d / "table_scale.npy", np.ones(meta["table"]["dim"], np.float32))
    meta["files"]["table_scale.npy"] = ""


def _zero_scale(meta, d):
    s = np.load(d / "table_scale.npy")
    s[3] = 0.0
    np.save(d / "table_scale.npy", s)


@pytest.mark.parametrize(("table", "change", "message"), [
    ("pca64", _as_int8, "table.npy: dtype float32 is not the int8 bundle.json describes"),
    ("pca64", lambda m, d: m["table"].update(dim=63),
     "table.npy: shape (30522, 64) does not match (30522, 63) in bundle.json"),
    ("pca64", lambda m, d: m["table"].update(dtype="float16"),
     "the table's dtype 'float16' or dim 64 is not one this edge reads (float32 or int8, dim >= 1)"),
    ("pca32-int8", _zero_scale,
     "table_scale.npy: the table's scale must be finite and > 0 in every column"),
    ("pca32-int8", lambda m, d: (m["table"].pop("scale_file"), m["files"].pop("table_scale.npy")),
     "bundle.json: an int8 table needs its table_scale.npy"),
    ("pca64", lambda m, d: m["table"].update(scale_file="table_scale.npy"),
     "contents do not reproduce bundle_id"),
])
def test_a_table_that_does_not_match_its_description_is_refused_alike(table_dirs, tmp_path,
                                                                      table, change, message):
    bad = _rewrite(table_dirs[table], tmp_path / "bad", change)
    inp = tmp_path / "in.txt"
    write_lines(inp, SENTENCES)
    out = tmp_path / "out.jsonl"
    js = js_edge("privatize", str(inp), "--eta", "65", "--bundle", str(bad), "-o", str(out),
                 tmp=tmp_path)
    py = py_edge("privatize", str(inp), "--eta", "65", "--bundle", str(bad), "-o", str(out),
                 "--no-progress", tmp=tmp_path)
    assert js.returncode == py.returncode == 1, js.stderr + py.stderr
    assert js.stderr == py.stderr.replace("edge-agent", "privbert-edge")
    assert message in js.stderr and js.stderr.count("\n") == 1
    assert not out.exists()


def _listing(*extra: str):
    """A change that adds ``extra`` to the policy's list, sorted, with its size and digest
    recomputed (what a hostile server signs)."""
    def change(meta, d):
        from shared import policy

        toks = sorted(meta["policy"]["tokens"] + list(extra))
        meta["policy"].update(tokens=toks, size=len(toks), sha256=policy.tokens_digest(toks))
    return change


@pytest.mark.parametrize(("change", "message"), [
    (_listing("secret"), "lists 1 word(s) that are not public (e.g. 'secret'): a public list "
     "may hold only function words and punctuation"),
    (_listing("whom"), "lists 'whom', which is not a regular token of the bundle's tokenizer"),
    (lambda m, d: m["policy"].update(sha256="0" * 64), "the policy's tokens do not match its "
     "sha256"),
])
def test_a_public_list_that_is_not_public_is_refused_alike(tiny_bundle, tmp_path, change,
                                                          message):
    """A bundle whose public list holds a content word (or a word its tokenizer does not
    have, or a list its digest does not match) is refused by both edges in the same line,
    nothing written or charged."""
    src = tiny_bundle.with_policy("function-words").save(tmp_path / "src")
    bad = _rewrite(src, tmp_path / "bad", change)
    inp = tmp_path / "in.txt"
    write_lines(inp, ["the secret marker"])
    out = tmp_path / "out.jsonl"
    args = ["privatize", str(inp), "--eta", "6", "--public-p", "0.3", "--bundle", str(bad),
            "-o", str(out)]
    js = js_edge(*args, tmp=tmp_path)
    py = py_edge(*args, "--no-progress", tmp=tmp_path)
    assert js.returncode == py.returncode == 1, js.stderr + py.stderr
    assert js.stderr == py.stderr.replace("edge-agent", "privbert-edge")
    assert message in js.stderr and js.stderr.count("\n") == 1
    assert not out.exists() and not (tmp_path / "js-ledger.json").exists()


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def test_a_swapped_bundle_is_refused_by_the_pin_in_both_edges(server, minilm_bundle, tmp_path):
    """The two edges share pins.json: what one pinned, the other holds to."""
    first = minilm_bundle.with_table("pca16-int8")
    second = minilm_bundle.with_table("pca8-int8")
    pins = tmp_path / "cache" / "pins.json"
    inp = tmp_path / "in.txt"
    write_lines(inp, SENTENCES)

    def run(prog, *extra, env=None):
        if prog == "js":
            return js_edge("privatize", str(inp), "--eta", "30", "--server", server.url,
                           "--model", "m1", *extra, tmp=tmp_path, env=env)
        return py_edge("privatize", str(inp), "--eta", "30", "--server", server.url,
                       "--model", "m1", "--no-progress", *extra, tmp=tmp_path, env=env)

    serve_model(server, first, params={"eta": 30.0})
    ok = run("js")
    assert ok.returncode == 0, ok.stderr
    assert f"privbert-edge: bundle {first.bundle_id[:12]}… pinned for model m1" in ok.stderr
    assert json.loads(pins.read_text()) == {
        "version": 1, "pins": {f"{server.url}|m1": first.bundle_id}}
    assert pins.stat().st_mode & 0o777 == 0o600
    assert run("py").returncode == 0  # edge-agent reads the web edge's pin: the same bundle

    serve_model(server, second, params={"eta": 30.0})
    fetches = sum(r["path"] == f"/v1/bundles/{second.bundle_id}" for r in server.requests)
    js, py = run("js"), run("py")
    assert js.returncode == py.returncode == 1, js.stderr + py.stderr
    assert js.stdout == py.stdout == ""
    assert js.stderr == py.stderr.replace("edge-agent", "privbert-edge")
    assert "never changes silently" in js.stderr and js.stderr.count("\n") == 1
    assert first.bundle_id[:12] in js.stderr and f"--accept-bundle {second.bundle_id}" in js.stderr
    assert sum(r["path"] == f"/v1/bundles/{second.bundle_id}"
               for r in server.requests) == fetches  # refused before a byte was fetched

    for extra, env in ((("--refuse-unverified",), None),
                       ((), {"PRIVBERT_REFUSE_UNVERIFIED": "1"})):  # pca8-int8: unverified
        js, py = run("js", *extra, env=env), run("py", *extra, env=env)
        assert js.returncode == py.returncode == 1
        assert js.stderr == py.stderr.replace("edge-agent", "privbert-edge")
        assert "is unverified" in js.stderr and "--refuse-unverified refuses it" in js.stderr
    js, py = run("js", "--accept-bundle", "xyz"), run("py", "--accept-bundle", "xyz")
    assert js.returncode == py.returncode == 1
    assert js.stderr == py.stderr.replace("edge-agent", "privbert-edge")

    accepted = run("js", "--accept-bundle", second.bundle_id)
    assert accepted.returncode == 0, accepted.stderr
    assert f"bundle {second.bundle_id[:12]}… accepted for model m1 (--accept-bundle)" in \
        accepted.stderr
    assert run("py").returncode == 0  # the new pin holds for both
    assert run("js").returncode == 0

    pins.write_text("{not json")
    js, py = run("js"), run("py")
    assert js.returncode == py.returncode == 1
    assert js.stderr == py.stderr.replace("edge-agent", "privbert-edge")
    assert "not a privbert pins file" in js.stderr
