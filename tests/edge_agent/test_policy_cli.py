"""A token policy through the real `edge-agent` CLI: payloads that say it, a ledger that counts
the public words apart from what it charges, a budget that shows both, and refusals."""

from __future__ import annotations

import json

import pytest

from shared import ledger
from shared.accounting import bundle_diameter
from shared.payload import parse_record
from tests.edge_agent.conftest import assert_one_line_error, run_cli

TEXTS = ["the movie is good", "a very fun story , and it was not boring !", "dull plot"]


@pytest.fixture(scope="module")
def policy_dir(tiny_bundle, tmp_path_factory):
    return tiny_bundle.with_policy("function-words").save(tmp_path_factory.mktemp("pol"))


def test_privatize_under_a_policy_counts_public_words_apart(policy_dir, tmp_path,
                                                             monkeypatch):
    from shared.bundle import EdgeBundle

    b = EdgeBundle.load(policy_dir)
    ledger_file = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("PRIVBERT_LEDGER", str(ledger_file))
    src = tmp_path / "in.txt"
    src.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out.jsonl"
    proc = run_cli("privatize", str(src), "--eta", "6", "--public-p", "0.3", "--bundle",
                   str(policy_dir), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    recs = [parse_record(x) for x in out.read_text().splitlines()]
    assert [r.payload.params.model_dump() for r in recs] == [{"eta": 6.0, "public_p": 0.3}] * 3
    assert all(r.payload.bundle_id == b.bundle_id for r in recs)
    # the summary line prints the guarantee with what it does not cover
    assert "public words of policy function-words are sent unchanged with probability 0.7" \
        in proc.stderr
    # the ledger: public words counted, the others charged
    tok = b.text_tokenizer()
    encs = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    public = sum(int(b.policy.public_mask(e).sum()) for e in encs)
    total = sum(len(e) for e in encs)
    assert public == 8  # the, is, a, ",", and, it, was, "!"
    status = json.loads(run_cli("budget", "--json").stdout)
    fam = status["families"]["dchi"]
    assert fam["tokens"] == total - public and fam["public"] == public
    d = bundle_diameter(b)
    assert fam["epsilon"] == pytest.approx(6.0 * (total - public) * d, rel=1e-12)
    text = run_cli("budget").stdout
    assert f"{public} public words sent under a token policy (no guarantee, not charged)" in text


def test_public_p_without_a_policy_in_the_bundle_is_refused(tiny_bundle, tmp_path):
    d = tiny_bundle.save(tmp_path / "plain")
    src = tmp_path / "in.txt"
    src.write_text("the movie\n")
    proc = run_cli("privatize", str(src), "--eta", "6", "--public-p", "0.3", "--bundle", str(d),
                   "-o", str(tmp_path / "o.jsonl"))
    assert_one_line_error(proc, 2)
    assert "needs a bundle with a token policy" in proc.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_a_bundle_whose_list_holds_a_content_word_is_refused(policy_dir, tmp_path):
    from shared import policy
    from shared.bundle import EdgeBundle

    d = tmp_path / "bad"
    EdgeBundle.load(policy_dir).save(d)
    meta = json.loads((d / "bundle.json").read_text())
    toks = sorted(meta["policy"]["tokens"] + ["secret"])
    meta["policy"].update(tokens=toks, size=len(toks), sha256=policy.tokens_digest(toks))
    meta["bundle_id"] = EdgeBundle._compute_id(meta)
    (d / "bundle.json").write_text(json.dumps(meta))
    src = tmp_path / "in.txt"
    src.write_text("the secret marker\n")
    proc = run_cli("privatize", str(src), "--eta", "6", "--public-p", "0.3", "--bundle", str(d),
                   "-o", str(tmp_path / "o.jsonl"))
    assert proc.returncode != 0
    assert "not public (e.g. 'secret')" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "o.jsonl").exists()


def test_an_old_ledger_is_migrated_and_keeps_its_spend(tmp_path, monkeypatch):
    """A version-3 ledger (no public column) opens, migrates, and reads its spend back."""
    import sqlite3

    from edge_agent.budget.ledger import DeviceLedger

    path = tmp_path / "old.sqlite3"
    with DeviceLedger.open(path) as led:
        led.charge([ledger.cost("dchi-text", {"eta": 2.0}, tokens=3, diameter=1.0)], [b"{}"],
                   [None], mechanism="dchi-text", params={"eta": 2.0}, bundle_id="0" * 64)
    db = sqlite3.connect(path)
    for table in ("spend", "charges"):  # back to the version-3 schema
        db.execute(f"ALTER TABLE {table} DROP COLUMN public")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    with DeviceLedger.open(path) as led:
        st = led.status()
        assert st.spend.families["dchi"].tokens == 3 and st.spend.families["dchi"].public == 0
        assert st.spent == pytest.approx(6.0)
        led.charge([ledger.cost("dchi-text", {"eta": 2.0, "public_p": 0.5}, tokens=4,
                                diameter=1.0, public=1)], [b"{}"], [None],
                   mechanism="dchi-text", params={"eta": 2.0, "public_p": 0.5},
                   bundle_id="0" * 64)
        st = led.status()
        assert (st.spend.families["dchi"].tokens, st.spend.families["dchi"].public) == (6, 1)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 4
