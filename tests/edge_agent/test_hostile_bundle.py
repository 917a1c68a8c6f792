"""A hostile server's bundle (issue 34): the table decides everything, so the edge checks it.

The attack as it was found: scale every regular row of the table by 1,000 and make each of
the 1,000 rows the old floor sampled (a fixed seed) a copy of another row, save it with a
valid bundle_id. The old floor then estimated 0.0 unchanged at every eta while 98.5% of
tokens left unchanged at eta 65. Each variant below must be refused by the real
``edge-agent`` in one line, with nothing written, and a server that swaps the bundle of a
model must be refused by the pin.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shared.bundle import EdgeBundle
from shared.floor import THRESHOLD, DChiFloor, weak_privacy_reason
from shared.mechanisms import DChiText
from tests.edge_agent.conftest import assert_one_line_error, run_cli
from tests.edge_agent.test_server_paths import serve_model

SENTENCES = "a gripping , funny film\nthe plot is thin and the acting worse\n"


def hostile(bundle: EdgeBundle, *, scale: float = 1000.0, copies: bool = True,
            jitter: float = 0.0) -> EdgeBundle:
    """The attack's table, with a valid bundle_id (the server signs what it likes)."""
    emb = np.array(bundle.embeddings, dtype=np.float32)
    reg = np.asarray(bundle.regular_ids)
    emb[reg] *= scale
    if copies:
        rows = np.random.default_rng(0).choice(reg.size, size=1000, replace=False)
        src = reg[(rows + 1) % reg.size]
        emb[reg[rows]] = emb[src] + jitter * np.random.default_rng(1).standard_normal(
            (rows.size, emb.shape[1])).astype(np.float32)
    meta = {k: v for k, v in bundle.meta.items() if k not in ("files", "bundle_id")}
    return EdgeBundle(bundle._tokenizer_json, emb, meta)


@pytest.fixture(scope="module")
def hostile_dirs(minilm_bundle, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    return {name: b.save(root / name) for name, b in {
        "copies": hostile(minilm_bundle),
        "scaled": hostile(minilm_bundle, copies=False),
        "near-copies": hostile(minilm_bundle, jitter=1e-4),
    }.items()}


def test_the_scaled_table_is_nearly_the_raw_text(minilm_bundle):
    """Why it must be refused: at eta 65 almost every token leaves unchanged."""
    b = hostile(minilm_bundle, copies=False)
    rng = np.random.default_rng(4)
    x = rng.choice(b.regular_ids, 2000)
    assert (DChiText(b, 65.0).privatize_ids(x, rng) == x).mean() > THRESHOLD


@pytest.mark.parametrize("variant,why", [
    ("copies", "identical rows"),
    ("near-copies", "near-duplicate rows"),
    ("scaled", "tokens drawn at random came back unchanged"),
])
def test_edge_agent_refuses_the_hostile_bundle(hostile_dirs, tmp_path, variant, why):
    src = tmp_path / "in.txt"
    src.write_text(SENTENCES)
    out = tmp_path / "out.jsonl"
    proc = run_cli("privatize", str(src), "--mechanism", "dchi-text", "--eta", "65",
                   "--bundle", str(hostile_dirs[variant]), "-o", str(out),
                   env={"PRIVBERT_LEDGER": str(tmp_path / "ledger.sqlite3")})
    line = assert_one_line_error(proc, 2, "weaker than the privacy floor")
    assert why in line
    assert not out.exists()
    assert proc.stdout == ""


def test_the_genuine_bundle_at_eta_65_passes(minilm_bundle):
    assert weak_privacy_reason(DChiText(minilm_bundle, 65.0)) is None


def test_the_line_lets_the_papers_highest_utility_setting_pass(minilm_bundle):
    """Qu et al. Table 3's largest eta (175 on BERT-base) leaves 95.11% of tokens unchanged;
    the eta with that inversion on MiniLM passes, and the hostile 98.5% does not."""
    f = DChiFloor(minilm_bundle.embeddings[minilm_bundle.regular_ids], rng=0)
    lo, hi = 50.0, 5000.0
    for _ in range(40):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if f.unchanged(mid) < 0.9511 else (lo, mid)
    assert weak_privacy_reason(DChiText(minilm_bundle, hi)) is None
    assert 0.9511 < THRESHOLD < 0.985


def test_a_swapped_bundle_is_refused_by_the_pin(fake_server, minilm_bundle, tmp_path):
    """A server that names another bundle for the same model is refused before any of it
    is fetched; --accept-bundle accepts it explicitly; --refuse-unverified refuses a bundle
    neither known nor trusted, before any of it is fetched."""
    first = minilm_bundle.with_table("pca16-int8")
    second = minilm_bundle.with_table("pca8-int8")
    env = {"PRIVBERT_CACHE": str(tmp_path / "cache"),
           "PRIVBERT_LEDGER": str(tmp_path / "ledger.sqlite3")}
    src = tmp_path / "in.txt"
    src.write_text(SENTENCES)

    def privatize(*extra: str):
        return run_cli("privatize", str(src), "--mechanism", "dchi-text", "--eta", "30",
                       "--server", fake_server.url, "--model", "m1", *extra, env=env)

    serve_model(fake_server, first, params={"eta": 30.0})
    ok = privatize()
    assert ok.returncode == 0, ok.stderr
    assert "pinned" in ok.stderr
    pins = json.loads((tmp_path / "cache" / "pins.json").read_text())["pins"]
    assert list(pins.values()) == [first.bundle_id]
    assert (tmp_path / "cache" / "pins.json").stat().st_mode & 0o777 == 0o600

    serve_model(fake_server, second, params={"eta": 30.0})
    fetched_before = sum(r["path"] == f"/v1/bundles/{second.bundle_id}"
                         for r in fake_server.requests)
    refused = privatize()
    line = assert_one_line_error(refused, 1, "never changes silently")
    assert first.bundle_id[:12] in line and second.bundle_id[:12] in line
    assert refused.stdout == ""
    assert sum(r["path"] == f"/v1/bundles/{second.bundle_id}"
               for r in fake_server.requests) == fetched_before

    unverified = privatize("--refuse-unverified")  # pca8-int8 is no bundle privbert knows
    line = assert_one_line_error(unverified, 1, "is unverified")
    assert "--refuse-unverified refuses it" in line and second.bundle_id in line

    accepted = privatize("--accept-bundle", second.bundle_id)
    assert accepted.returncode == 0, accepted.stderr
    assert "accepted" in accepted.stderr
    again = privatize()  # the new pin holds
    assert again.returncode == 0, again.stderr


def test_a_damaged_pins_file_is_an_error_not_a_fresh_start(fake_server, minilm_bundle,
                                                           tmp_path):
    serve_model(fake_server, minilm_bundle.with_table("pca16-int8"), params={"eta": 30.0})
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "pins.json").write_text("{not json")
    src = tmp_path / "in.txt"
    src.write_text(SENTENCES)
    proc = run_cli("privatize", str(src), "--mechanism", "dchi-text", "--eta", "30",
                   "--server", fake_server.url, "--model", "m1",
                   env={"PRIVBERT_CACHE": str(tmp_path / "cache"),
                        "PRIVBERT_LEDGER": str(tmp_path / "ledger.sqlite3")})
    assert_one_line_error(proc, 1, "not a privbert pins file")
