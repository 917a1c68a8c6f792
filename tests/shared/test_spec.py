"""The mechanism spec and the files generated from it (issue 36): each committed file is what
its generator writes today, so a change to a mechanism, a constant or a refusal that is not
regenerated fails here (`python -m shared.spec` rewrites them); and the ziggurat tables the
web edge samples with are numpy's, checked by sampling with them."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from shared import floor, ledger, messages, spec
from shared.mechanisms import int8_pass, registry
from shared.spec import __main__ as gen
from shared.spec import typescript, ziggurat


@pytest.fixture(scope="module")
def built() -> dict:
    return spec.build()


def test_the_committed_spec_is_what_the_registry_generates(built):
    assert spec.SPEC_FILE.read_text(encoding="utf-8") == spec.dumps(built), \
        "shared/spec/mechanisms.json is stale: run `python -m shared.spec`"


def test_the_typescript_spec_is_generated_from_it(built):
    assert gen.SPEC_TS.read_text(encoding="utf-8") == typescript.render(built), \
        "web_edge/src/generated/spec.ts is stale: run `python -m shared.spec`"


def test_the_ziggurat_tables_are_numpys():
    assert gen.ZIGGURAT_TS.read_text(encoding="utf-8") == ziggurat.generate(), \
        "web_edge/src/random/ziggurat_tables.ts differs from numpy's tables: `python -m shared.spec`"


def test_check_mode_finds_a_stale_file(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "mechanisms.json"
    stale.write_text("{}\n")
    monkeypatch.setattr(gen, "generated", lambda: {stale: "[]\n"})
    monkeypatch.setattr(gen, "REPO", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "mechanisms.json: stale" in capsys.readouterr().err
    assert stale.read_text() == "{}\n"  # --check writes nothing
    assert gen.main([]) == 0 and stale.read_text() == "[]\n"


def test_the_spec_says_what_the_code_does(built):
    names = [m["name"] for m in built["mechanisms"]]
    assert names == list(registry.names())  # built-ins, in the registry's order
    assert [f["name"] for f in built["families"]] == list(ledger.FAMILIES)
    assert built["floor"]["THRESHOLD"] == floor.THRESHOLD == 0.97
    assert built["int8_pass"]["MAX_DIM"] == int8_pass.MAX_DIM
    assert built["int8_pass"]["GAMMA4"] == 4 * 2.0**-24 / (1 - 4 * 2.0**-24)
    assert built["messages"]["templates"] == messages.templates()
    by = {m["name"]: m for m in built["mechanisms"]}
    assert [f["flag"] for f in by["ome"]["flags"]] == ["--epsilon", "--lam"]  # layout fixed
    assert by["texthide"]["compared_params"] == ["m"]
    assert by["texthide"]["prediction_params"] == {"k": 1}
    assert by["texthide"]["flags"][1]["edge_default"] == 1
    assert [m["memo"] for m in built["mechanisms"]] == [False, True, True, True, True, False]
    assert by["dchi-text"]["payload"] == {"kind": "tokens", "classifier": "tokens",
                                          "reads_tokens": True, "field": "token_ids",
                                          "dtypes": ["int32"], "ndim": 1}


def _ts_tables() -> dict[str, list[float]]:
    text = gen.ZIGGURAT_TS.read_text(encoding="utf-8")
    out = {}
    for m in re.finditer(r"export const (\w+): readonly number\[\] = \[([^\]]*)\];", text):
        out[m.group(1)] = [float(x) for x in m.group(2).split(", ")]
    return out


class _Bits:
    def __init__(self, seed: int):
        self.bg = np.random.PCG64(seed)

    def u64(self) -> int:
        return int(self.bg.random_raw())

    def double(self) -> float:
        return (self.u64() >> 11) * (1.0 / 9007199254740992.0)


def _normal(b: _Bits, t: dict) -> float:
    """numpy's random_standard_normal (distributions.c) with the tables of the TypeScript."""
    r_nor, inv_r = float(ziggurat.NOR_R), float(ziggurat.NOR_INV_R)
    while True:
        r = b.u64()
        idx = r & 0xFF
        r >>= 8
        sign = r & 1
        rabs = (r >> 1) & 0x000FFFFFFFFFFFFF
        x = rabs * t["WI_DOUBLE"][idx]
        if sign:
            x = -x
        if rabs < t["KI_DOUBLE"][idx]:
            return x
        if idx == 0:
            while True:
                xx = -inv_r * math.log1p(-b.double())
                yy = -math.log1p(-b.double())
                if yy + yy > xx * xx:
                    return -(r_nor + xx) if (rabs >> 8) & 1 else r_nor + xx
        elif ((t["FI_DOUBLE"][idx - 1] - t["FI_DOUBLE"][idx]) * b.double()
              + t["FI_DOUBLE"][idx]) < math.exp(-0.5 * x * x):
            return x


def _exponential(b: _Bits, t: dict) -> float:
    """numpy's random_standard_exponential with the tables of the TypeScript."""
    while True:
        ri = b.u64() >> 3
        idx = ri & 0xFF
        ri >>= 8
        x = ri * t["WE_DOUBLE"][idx]
        if ri < t["KE_DOUBLE"][idx]:
            return x
        if idx == 0:
            return float(ziggurat.EXP_R) - math.log1p(-b.double())
        if ((t["FE_DOUBLE"][idx - 1] - t["FE_DOUBLE"][idx]) * b.double()
                + t["FE_DOUBLE"][idx]) < math.exp(-x):
            return x


@pytest.mark.parametrize("seed", [0, 20240501])
def test_sampling_with_the_typescript_tables_draws_what_numpy_draws(seed):
    """20,000 draws of each reach the tail and the wedges (the slow paths) too."""
    t = _ts_tables()
    b = _Bits(seed)
    got = [_normal(b, t) for _ in range(20000)]
    assert got == np.random.Generator(np.random.PCG64(seed)).standard_normal(20000).tolist()
    b = _Bits(seed)
    got = [_exponential(b, t) for _ in range(20000)]
    assert got == np.random.Generator(np.random.PCG64(seed)).standard_exponential(
        20000).tolist()
