"""The golden vectors (``tests/golden/*.json``, written by ``python -m tests.golden.make_golden``)
are what the Python edge computes today: PCG64 and its samplers, dχ noise, the exact nearest
row with near ties, ledger costs, the floor's decisions and messages for seeded generators,
and payload bytes of every mechanism (the real ``edge-agent privatize --seed`` for the token
mechanisms, on a tiny bundle and its pca4-int8 table). They were committed before the spec
refactor (issue 36) and every later change must leave them as they are; the web edge reads
the same files in ``npm test`` (``web_edge/test/golden.test.mjs``)."""

from __future__ import annotations

import json

import pytest

from tests.golden import make_golden


def _diff(a, b, path="") -> list[str]:
    """Where two JSON values differ (the first few paths)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:80]} != {str(b)[:80]}"]


@pytest.mark.parametrize("name", make_golden.FILES)
def test_the_python_edge_still_computes_the_golden_vectors(name):
    committed = (make_golden.HERE / f"{name}.json").read_text(encoding="utf-8")
    made = make_golden.dumps(make_golden.MAKERS[name]())
    assert made == committed, _diff(json.loads(made), json.loads(committed))[:10]


def test_the_golden_files_are_small():
    sizes = {n: (make_golden.HERE / f"{n}.json").stat().st_size for n in make_golden.FILES}
    assert sum(sizes.values()) < 400_000, sizes
