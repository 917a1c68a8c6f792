"""The bundles the edge knows (shared.trust): written once, published by the spec, and
rebuilt here from the packaged public model (issue 42), bare and with each named token policy
(issue 41). The 384-d table's ids, the tokenizer's digest and the public pieces per word are
cheap to rebuild and checked in the default suite; the PCA tables take seconds each and are
checked by the slow test."""

from __future__ import annotations

import pytest

from shared import floor_text, trust
from shared.bundle import EdgeBundle


def rebuilt_ids(bundle: EdgeBundle, table: str) -> dict[str, str]:
    """Name -> id of ``bundle`` (MiniLM with ``table``) bare and with each known policy."""
    return {trust.known_name(table, p): bundle.with_policy(p).bundle_id
            for p in (None, *trust.KNOWN_POLICIES)}


def test_the_384d_bundles_and_the_tokenizer_are_the_ones_the_package_builds(minilm_bundle):
    """The 384-d table bare and with each policy: a policy bundle's id covers its list, so
    each is a bundle of its own, known only if listed."""
    assert minilm_bundle.bundle_id == trust.KNOWN_BUNDLES["none"]
    got = rebuilt_ids(minilm_bundle, "none")
    assert got == {k: trust.KNOWN_BUNDLES[k] for k in got}
    assert all(trust.trust(i).kind == "known" for i in got.values())
    assert minilm_bundle.meta["files"]["tokenizer.json"] == trust.KNOWN_TOKENIZER


def test_the_known_policies_are_the_named_ones():
    from shared.policy import POLICIES

    assert set(trust.KNOWN_POLICIES) == set(POLICIES)


def test_public_pieces_per_word_is_the_packaged_tokenizers(minilm_bundle):
    """What the text floor compares a bundle's tokenizer with: measured again here."""
    assert floor_text.pieces_per_word(minilm_bundle) == pytest.approx(
        floor_text.PUBLIC_PIECES_PER_WORD, abs=5e-5)


@pytest.mark.slow
@pytest.mark.parametrize("table", [t for t in trust.KNOWN_TABLES if t != "none"])
def test_each_known_table_is_rebuilt_from_the_public_model(minilm_bundle, table):
    got = rebuilt_ids(EdgeBundle.from_model(table=table), table)
    assert got == {k: trust.KNOWN_BUNDLES[k] for k in got}


def test_every_known_table_has_an_id_and_no_other():
    names = {trust.known_name(t, p) for t in trust.KNOWN_TABLES for p in ("none", *trust.KNOWN_POLICIES)}
    assert set(trust.KNOWN_BUNDLES) == names == set(trust.KNOWN_NAMES)
    assert len(set(trust.KNOWN_BUNDLES.values())) == len(names)
    assert trust.trust(trust.KNOWN_BUNDLES["pca32-int8+function-words"]).name == "pca32-int8+function-words"


def test_trust_sorts_known_trusted_and_unverified():
    known = trust.KNOWN_BUNDLES["pca32-int8"]
    other = "ab" * 32
    assert trust.trust(known) == trust.Trust(known, "known", "pca32-int8")
    assert trust.trust(other).kind == "unverified"
    assert trust.trust(other, frozenset({other})).kind == "trusted"
    assert trust.trust(known, frozenset({known})).kind == "known"  # known wins
    assert not trust.trust(other).vouched and trust.trust(other, {other}).vouched


def test_the_guarantee_notes_name_the_bundle():
    other = "6be7" + "0" * 60
    assert trust.trust(other).note() == "bundle 6be700000000… unverified: checked by the floor only"
    assert "trusted by this app (--trusted-bundles)" in trust.trust(other, {other}).note()
    known = trust.trust(trust.KNOWN_BUNDLES["none"]).note()
    assert known.startswith("bundle f0fea3d59457… known: MiniLM-L6-H384 table none")


def test_the_spec_publishes_the_known_bundles_and_the_text_floor():
    from shared.spec import build

    spec = build()
    assert spec["known_bundles"]["bundles"] == trust.KNOWN_BUNDLES
    assert spec["known_bundles"]["tokenizer"] == trust.KNOWN_TOKENIZER
    tf = spec["text_floor"]
    assert tf["sample_sha256"] == floor_text.sample_digest()
    assert tf["DECODE_LINE"] == floor_text.DECODE_LINE
    assert tf["PUBLIC_PIECES_PER_WORD"] == floor_text.PUBLIC_PIECES_PER_WORD
