"""A hostile server against the real ``edge-agent`` (issue 42): it chooses the tokenizer and
the table (tests/hostile_bundles.py: valid ids, the genuine diameter), renames a model to get
a new bundle pinned, and hands over tables that break the arithmetic. Each is refused in one
line, with nothing written, charged or sent; the genuine tables pass at their matched eta.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shared.bundle import EdgeBundle
from shared.floor_text import DECODE_LINE, measure_text, text_floor_reason
from shared.mechanisms import DChiText
from shared.table import MATCHED_ETA
from tests.edge_agent.conftest import assert_one_line_error, run_cli
from tests.edge_agent.test_server_paths import serve_model
from tests.hostile_bundles import CRAFTED, built_elsewhere

SENTENCES = "a gripping , funny film\nthe plot is thin and the acting worse\n"


@pytest.fixture(scope="module")
def crafted(minilm_bundle) -> dict[str, EdgeBundle]:
    return {name: build(minilm_bundle) for name, build in CRAFTED.items()}


@pytest.fixture(scope="module")
def pca32(minilm_bundle) -> EdgeBundle:
    """The default table (its PCA fit takes seconds: once for the module)."""
    return minilm_bundle.with_table("pca32-int8")


def untrusted_env(tmp_path: Path) -> dict[str, str]:
    """A device of its own: cache, pins and ledger in ``tmp_path``, no trusted ids."""
    return {"PRIVBERT_CACHE": str(tmp_path / "cache"),
            "PRIVBERT_LEDGER": str(tmp_path / "ledger.sqlite3"),
            "PRIVBERT_TRUSTED_BUNDLES": ""}


def posted(server) -> int:
    return sum(r["method"] == "POST" for r in server.requests)


@pytest.mark.parametrize("name,why", [
    ("frequent-isolated", "a context-free decoder recovers"),
    ("char-tokenizer", "pieces per word"),
    ("groups-of-four", "a context-free decoder recovers"),
])
def test_each_crafted_bundle_is_refused_with_nothing_written_charged_or_sent(
        crafted, fake_server, tmp_path, name, why):
    bundle = crafted[name]
    serve_model(fake_server, bundle, params={"eta": 65.0})
    src = tmp_path / "in.txt"
    src.write_text(SENTENCES)
    out = tmp_path / "out.jsonl"
    env = untrusted_env(tmp_path)
    proc = run_cli("privatize", str(src), "--mechanism", "dchi-text", "--eta", "65",
                   "--server", fake_server.url, "--post", "predict", "-o", str(out), env=env)
    line = assert_one_line_error(proc, 2, "is unverified and weaker than the text floor")
    assert why in line and bundle.bundle_id[:12] in line
    assert "--trusted-bundles" in line and "--allow-weak-privacy privatizes anyway" in line
    assert proc.stdout == "" and not out.exists()
    assert posted(fake_server) == 0
    assert not (tmp_path / "ledger.sqlite3").exists()  # refused before the ledger is opened
    assert json.loads((tmp_path / "cache" / "pins.json").read_text()
                      if (tmp_path / "cache" / "pins.json").exists() else '{"pins": {}}'
                      )["pins"] == {}  # a refused bundle is never pinned


@pytest.mark.slow
def test_the_crafted_layouts_would_leave_text_nearly_readable(crafted):
    """Why they must be refused, measured with the text floor itself (the uniform floor of
    issue 34 lets each of them through)."""
    from shared.floor import weak_privacy_reason

    for name in ("frequent-isolated", "groups-of-four"):
        m = DChiText(crafted[name], 65.0)
        assert weak_privacy_reason(m) is None, name  # the uniform floor is fooled
        got = measure_text(m)
        assert got.decoded / got.draws > DECODE_LINE, (name, got)


def test_refuse_unverified_refuses_before_a_byte_is_fetched(crafted, fake_server, tmp_path):
    bundle = crafted["groups-of-four"]
    serve_model(fake_server, bundle, params={"eta": 65.0})
    src = tmp_path / "in.txt"
    src.write_text(SENTENCES)
    proc = run_cli("privatize", str(src), "--mechanism", "dchi-text", "--eta", "65",
                   "--server", fake_server.url, "--refuse-unverified", env=untrusted_env(tmp_path))
    line = assert_one_line_error(proc, 1, "--refuse-unverified refuses it")
    assert bundle.bundle_id in line
    assert not any(r["path"].startswith("/v1/bundles/") for r in fake_server.requests)


@pytest.mark.parametrize("table", ["pca32-int8", pytest.param("none", marks=pytest.mark.slow)])
def test_the_genuine_tables_pass_the_text_floor_at_their_matched_eta(minilm_bundle, pca32, table):
    """Were they unverified (built on a machine whose PCA rounds otherwise), the text floor
    would let them through: about a third decodable, far under the line."""
    b = pca32 if table == "pca32-int8" else minilm_bundle.with_table(table)
    m = DChiText(b, MATCHED_ETA[table])
    got = measure_text(m)
    assert text_floor_reason(m, measured=got) is None
    assert got.decoded / got.draws < 0.4 and got.unchanged / got.draws < 0.4


# pca32-int8 under function-words: the η of the frontier's policy runs (bench.utility frontier)
POLICY_ETA = 40.0


def test_a_genuine_table_under_a_policy_passes_judged_on_the_words_outside_its_list(pca32):
    """Issue 41 x 42: the public words may go out as typed (probability 1 - p) by design, so
    the text floor leaves them out, as the privacy floor does; the genuine table, unverified
    (built elsewhere), then passes whatever p is, judged on the content words alone."""
    from edge_agent.privatize.privatizer import Privatizer

    b = built_elsewhere(pca32.with_policy("function-words"))
    priv = Privatizer(b, DChiText(b, POLICY_ETA, public_p=0.3), trusted_bundles=frozenset())
    assert priv.trust.kind == "unverified" and priv.weak_privacy is None
    got = measure_text(DChiText(b, POLICY_ETA, public_p=1.0), np.random.default_rng(4))
    assert got == measure_text(DChiText(b, POLICY_ETA, public_p=0.0), np.random.default_rng(4))
    bare = measure_text(DChiText(built_elsewhere(b.with_policy(None)), POLICY_ETA),
                        np.random.default_rng(4))
    assert 200 < got.tokens < bare.tokens  # the public words: neither privatized nor judged
    assert got.decoded / got.draws < 0.45 and got.unchanged / got.draws < 0.45


def test_a_crafted_table_is_still_refused_under_a_policy(crafted):
    """A policy spares only the public words: a table that isolates the frequent pieces
    still leaves the content words among them readable, and is refused."""
    from edge_agent.privatize.privatizer import Privatizer
    from shared.floor import WeakPrivacyError

    b = crafted["frequent-isolated"].with_policy("function-words")
    with pytest.raises(WeakPrivacyError, match="a context-free decoder recovers"):
        Privatizer(b, DChiText(b, 65.0, public_p=0.3), trusted_bundles=frozenset())


def test_a_renamed_model_does_not_get_its_new_bundle_pinned(tiny_bundle, fake_server,
                                                            tmp_path):
    """Without --model, a server that renames its only model and names a new bundle used to
    get the new bundle pinned afresh."""
    first, second = tiny_bundle, tiny_bundle.with_table("pca4-int8")
    src = tmp_path / "in.txt"
    src.write_text(SENTENCES)
    env = untrusted_env(tmp_path)

    def privatize(*extra: str):
        return run_cli("privatize", str(src), "--mechanism", "dchi-text", "--eta", "1",
                       "--server", fake_server.url, *extra, env=env)

    serve_model(fake_server, first, params={"eta": 1.0})
    ok = privatize()
    assert ok.returncode == 0, ok.stderr
    models = json.loads(fake_server.routes[("GET", "/v1/models")][2])
    models["models"][0]["id"] = "m1-v2"
    models["models"][0]["bundle_id"] = second.bundle_id
    fake_server.json_route("GET", "/v1/models", models)
    fake_server.routes[("GET", f"/v1/bundles/{second.bundle_id}")] = (
        200, {"Content-Type": "application/x-tar"}, second.to_tar_bytes())
    refused = privatize()
    line = assert_one_line_error(refused, 1, "no longer serves model m1")
    assert "m1-v2" in line and second.bundle_id in line and first.bundle_id[:12] in line
    assert refused.stdout == ""
    assert not any(r["path"] == f"/v1/bundles/{second.bundle_id}" for r in fake_server.requests)
    accepted = privatize("--accept-bundle", second.bundle_id)
    assert accepted.returncode == 0, accepted.stderr
    assert privatize().returncode == 0  # pinned now
    # the same bundle under a new name is no change of meaning: pinned without a question
    models["models"][0]["id"] = "m1-v3"
    fake_server.json_route("GET", "/v1/models", models)
    assert privatize().returncode == 0


def scaled(bundle: EdgeBundle, table: np.ndarray) -> EdgeBundle:
    meta = {k: v for k, v in bundle.meta.items() if k not in ("files", "bundle_id")}
    return EdgeBundle(bundle._tokenizer_json, table.astype(np.float32), meta)


@pytest.mark.parametrize("what,why,code", [
    ("subnormal", "are subnormal", 2),
    ("negative-zero", "identical rows", 2),
    ("infinite", "whose norm is not finite", 2),
])
def test_broken_tables_are_refused_before_anything_is_written(tiny_bundle, tmp_path, what,
                                                               why, code):
    emb = np.array(tiny_bundle.embeddings, dtype=np.float32)
    reg = tiny_bundle.regular_ids
    if what == "subnormal":
        emb = emb * np.float32(1e-39)  # every value subnormal or zero; D rounds to nothing
    elif what == "negative-zero":  # two rows that differ only by the sign of a zero
        emb[reg[1]] = emb[reg[0]]
        emb[reg[0], 0], emb[reg[1], 0] = np.float32(0.0), np.float32(-0.0)
    else:
        emb[reg[3]] = np.inf
    d = scaled(tiny_bundle, emb).save(tmp_path / "b")
    src = tmp_path / "in.txt"
    src.write_text(SENTENCES)
    out = tmp_path / "out.jsonl"
    env = {"PRIVBERT_LEDGER": str(tmp_path / "ledger.sqlite3")}
    proc = run_cli("privatize", str(src), "--mechanism", "dchi-text", "--eta", "5",
                   "--bundle", str(d), "-o", str(out), env=env)
    line = assert_one_line_error(proc, code)
    assert why in line and "Traceback" not in proc.stderr
    assert not out.exists() and not (tmp_path / "ledger.sqlite3").exists()


def test_pins_json_has_the_ledgers_rules(tmp_path, capsys):
    """Others may not write it (they could pin a bundle of theirs), reading is warned about,
    a symlink is resolved once: its target is read and replaced, the link stays."""
    import os

    from edge_agent.errors import CliError
    from edge_agent.service.pins import Pins, check_pin

    a, b = "a" * 64, "b" * 64
    target = tmp_path / "real-pins.json"
    check_pin(Pins(target), "http://s", "m1", a)
    os.chmod(target, 0o666)
    with pytest.raises(CliError, match=r"writable by others \(mode 666\).*chmod 600"):
        Pins(target).read()
    os.chmod(target, 0o644)
    assert Pins(target).read() == {"http://s|m1": a}
    assert "readable by others (mode 644)" in capsys.readouterr().err
    os.chmod(target, 0o600)
    link = tmp_path / "pins.json"
    link.symlink_to(target)
    check_pin(Pins(link), "http://s", "m2", b)
    assert link.is_symlink()
    assert json.loads(target.read_text())["pins"] == {"http://s|m1": a, "http://s|m2": b}
