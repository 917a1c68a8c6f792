"""Folders and payloads written before mechanisms became registered objects still load,
parse and predict the same (``tests/data/make_before_registry.py`` wrote them, with the
code of commit b81e198)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from models.versions.model_version import load_model
from shared.payload import MECHANISMS, parse_payload

DATA = Path(__file__).resolve().parent.parent / "data" / "before_registry"


@pytest.mark.parametrize("name", ["dchi-text", "ome", "texthide"])
def test_an_old_version_folder_loads_and_predicts_the_same(name):
    mv = load_model(DATA / name)
    assert mv.mechanism == name
    lines = (DATA / f"{name}.jsonl").read_bytes().splitlines()
    payloads = [parse_payload(ln) for ln in lines]
    want = np.array(json.loads((DATA / "expected.json").read_text())[name])
    np.testing.assert_allclose(mv.predict_proba(payloads), want, rtol=0, atol=1e-6)


def test_the_wire_format_is_unchanged():
    """Every mechanism's payload parses and serializes back to the same bytes."""
    lines = (DATA / "wire.jsonl").read_bytes().splitlines()
    seen = []
    for ln in lines:
        p = parse_payload(ln)
        assert p.model_dump_json(exclude_none=True).encode() == ln
        seen.append(p.mechanism)
    assert sorted(seen) == sorted(MECHANISMS)
