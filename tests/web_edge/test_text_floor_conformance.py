"""The text floor of issue 42 in both edges.

* For a seeded generator, `@privbert/edge`'s text floor (tests/web_edge/text_floor.mjs) and
  `shared.floor_text.measure_text` privatize the same occurrences in the same order with the
  same noise, and count, decode and word alike: the same measurement and the same message;
  under a token policy both judge only the words outside its public list.
* The crafted MiniLM bundles of issue 42 (tests/hostile_bundles.py) are refused by the real
  `privbert-edge` as by `edge-agent`: exit 2, one line, nothing written, nothing charged; under
  a token policy too, while the genuine table under a policy passes.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from shared.floor_text import measure_text, text_floor_reason
from shared.mechanisms import DChiText
from tests.conftest import REPO
from tests.hostile_bundles import CRAFTED, built_elsewhere, frequent_isolated
from tests.web_edge.conftest import js_edge

TEXT_FLOOR_JS = Path(__file__).with_name("text_floor.mjs")


def js_text_floor(bundle_dir: Path, seed: int, *etas: float, policy: bool = False) -> list[dict]:
    p = subprocess.run(["node", str(TEXT_FLOOR_JS), *(["--policy"] if policy else []),
                        str(bundle_dir), str(seed), *map(repr, etas)],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    return [json.loads(x) for x in p.stdout.splitlines()]


@pytest.mark.parametrize("which,seed,etas", [
    ("tiny", 3, (30.0, 0.3, 4.0)),  # refused at the first step, passed at it, several steps
    pytest.param("pca32-int8", 7, (45.0,), marks=pytest.mark.slow),  # the default table
])
def test_a_seeded_text_floor_is_the_python_edges(tiny_bundle, tiny_dir, minilm_bundle, tmp_path,
                                                 which, seed, etas):
    if which == "tiny":
        bundle, d = tiny_bundle, tiny_dir
    else:
        bundle = minilm_bundle.with_table(which)
        d = bundle.save(tmp_path / which)
    js = js_text_floor(d, seed, *etas)
    for eta, got in zip(etas, js, strict=True):
        mech = DChiText(bundle, eta)
        py = measure_text(mech, np.random.default_rng(seed))
        assert got["measure"] == dataclasses.asdict(py), eta
        assert got["reason"] == text_floor_reason(mech, measured=py), eta


def test_a_seeded_text_floor_under_a_policy_is_the_python_edges(tiny_bundle, tmp_path):
    """The tiny bundle with the function-words list: both edges leave its public words out
    (fewer tokens measured), whatever p is, and agree draw for draw."""
    bundle = tiny_bundle.with_policy("function-words")
    d = bundle.save(tmp_path / "tiny-policy")
    etas = (30.0, 4.0)
    js = js_text_floor(d, 5, *etas, policy=True)
    for eta, got in zip(etas, js, strict=True):
        mech = DChiText(bundle, eta, public_p=0.3)
        py = measure_text(mech, np.random.default_rng(5))
        assert 0 < py.tokens < measure_text(DChiText(tiny_bundle, eta), np.random.default_rng(5)).tokens
        assert py == measure_text(DChiText(bundle, eta, public_p=1.0), np.random.default_rng(5))
        assert got["measure"] == dataclasses.asdict(py), eta
        assert got["reason"] == text_floor_reason(mech, measured=py), eta


@pytest.fixture(scope="module")
def crafted_dirs(minilm_bundle, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("crafted")
    return {name: build(minilm_bundle).save(root / name) for name, build in CRAFTED.items()}


@pytest.mark.parametrize("name,why", [
    ("char-tokenizer", "pieces per word"),
    pytest.param("frequent-isolated", "a context-free decoder recovers", marks=pytest.mark.slow),
    pytest.param("groups-of-four", "a context-free decoder recovers", marks=pytest.mark.slow),
])
def test_privbert_edge_refuses_the_crafted_minilm_bundles(crafted_dirs, tmp_path, name, why):
    src = tmp_path / "in.txt"
    src.write_text("a gripping , funny film\nthe plot is thin and the acting worse\n")
    out = tmp_path / "out.jsonl"
    p = js_edge("privatize", str(src), "--eta", "65", "--bundle", str(crafted_dirs[name]),
                "-o", str(out), tmp=tmp_path, env={"PRIVBERT_TRUSTED_BUNDLES": ""})
    assert p.returncode == 2, p.stderr
    assert p.stdout == "" and len(p.stderr.splitlines()) == 1, p.stderr
    assert "is unverified and weaker than the text floor at eta=65" in p.stderr and why in p.stderr
    assert not out.exists() and not (tmp_path / "js-ledger.json").exists()


@pytest.mark.parametrize("what", ["genuine", pytest.param("crafted", marks=pytest.mark.slow)])
def test_privbert_edge_under_a_policy_passes_the_genuine_table_and_refuses_a_crafted_one(
        minilm_bundle, tmp_path, what):
    """The text floor of Privatizer.open under a token policy (--public-p) judges the words
    outside the list: pca32-int8 with function-words, unverified (built elsewhere), passes at
    the frontier's η 40; the frequent pieces isolated are refused at η 65 as without a policy."""
    if what == "genuine":
        bundle, eta = built_elsewhere(minilm_bundle.with_table("pca32-int8").with_policy("function-words")), "40"
    else:
        bundle, eta = frequent_isolated(minilm_bundle).with_policy("function-words"), "65"
    d = bundle.save(tmp_path / what)
    src = tmp_path / "in.txt"
    src.write_text("a gripping , funny film\nthe plot is thin and the acting worse\n")
    out = tmp_path / "out.jsonl"
    p = js_edge("privatize", str(src), "--eta", eta, "--public-p", "0.3", "--bundle", str(d),
                "-o", str(out), tmp=tmp_path, env={"PRIVBERT_TRUSTED_BUNDLES": ""})
    if what == "genuine":
        assert p.returncode == 0, p.stderr
        assert f"bundle {bundle.bundle_id[:12]}… unverified: checked by the floor only" in p.stderr
        assert len(out.read_text().splitlines()) == 2
    else:
        assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
        assert "is unverified and weaker than the text floor at eta=65" in p.stderr
        assert "a context-free decoder recovers" in p.stderr and not out.exists()
