"""The token policy (shared.policy): public lists, word-by-word masks, the SanText+ coin, and
what the bundle, the mechanisms, the ledger, the floor and the guarantee make of it."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest

from shared import ledger, policy
from shared.accounting import summary
from shared.bundle import BundleError, EdgeBundle
from shared.floor import floor_tokens, measure_unchanged
from shared.mechanisms import DChiEmbedding, DChiText, create
from shared.payload import parse_payload

# sha256 of scikit-learn 1.x's ENGLISH_STOP_WORDS, sorted, one per line: the list copied in
# shared.policy must stay that package's list
SKLEARN_DIGEST = "40e0a284c5b9a220efffd18d4d739fbd3270091d6ce2c75b6effe289d3be5487"


def _digest(words) -> str:
    return hashlib.sha256("\n".join(sorted(words)).encode()).hexdigest()


def test_the_stop_list_is_scikit_learns():
    assert len(policy.SKLEARN_STOP_WORDS) == len(set(policy.SKLEARN_STOP_WORDS)) == 318
    assert _digest(policy.SKLEARN_STOP_WORDS) == SKLEARN_DIGEST
    sklearn = pytest.importorskip("sklearn.feature_extraction.text")
    assert set(policy.SKLEARN_STOP_WORDS) == set(sklearn.ENGLISH_STOP_WORDS)


def test_the_lists_hold_function_words_and_punctuation_only():
    ref = policy.REFERENCE
    for name, words in policy.POLICIES.items():
        assert set(words) <= ref, name
        assert not set(words) & policy.CONTENT_WORDS, name
    # numbers and content words of the stop list are never public
    for w in ("one", "twenty", "hundred", "name", "fire", "system", "bill"):
        assert w not in ref
    # the default list leaves the negations and intensifiers to the mechanism, the other keeps
    assert "not" not in policy.POLICIES["function-words"]
    assert "not" in policy.POLICIES["function-words+negations"]
    assert {"the", "a", "and", ".", ","} <= set(policy.POLICIES["function-words"])


@pytest.fixture(scope="module")
def tiny_policy_bundle(tiny_bundle):
    return tiny_bundle.with_policy("function-words")


def test_a_policy_is_part_of_the_bundle_and_its_id(tiny_bundle, tiny_policy_bundle, tmp_path):
    b, bp = tiny_bundle, tiny_policy_bundle
    assert b.policy is None and bp.policy is not None
    assert b.bundle_id != bp.bundle_id
    block = bp.meta["policy"]
    assert block["name"] == "function-words" and block["size"] == len(block["tokens"])
    assert block["sha256"] == policy.tokens_digest(block["tokens"])
    assert "scikit-learn" in block["source"]
    # the tiny vocabulary's public words: whole words of the list, nothing else
    assert set(block["tokens"]) == {"the", "a", "is", "was", "and", "it", "this", ",", ".",
                                    "!"}
    for loaded in (EdgeBundle.load(bp.save(tmp_path / "b"), expected_id=bp.bundle_id),
                   EdgeBundle.from_tar_bytes(bp.to_tar_bytes(), expected_id=bp.bundle_id)):
        assert loaded.policy is not None and loaded.policy.digest == bp.policy.digest
        assert np.array_equal(loaded.policy.public, bp.policy.public)
    # "none" gives the bundle without a policy back, with its id
    assert bp.with_policy("none").bundle_id == b.bundle_id


def _tampered(bundle, tmp_path, edit) -> EdgeBundle:
    d = bundle.save(tmp_path / "t")
    meta = json.loads((d / "bundle.json").read_text())
    edit(meta["policy"])
    meta.pop("bundle_id")
    meta["bundle_id"] = EdgeBundle._compute_id(meta)  # a server can sign whatever it likes
    (d / "bundle.json").write_text(json.dumps(meta))
    return EdgeBundle.load(d)


@pytest.mark.parametrize("edit, says", [
    (lambda p: (p["tokens"].append("movie"), p["tokens"].sort(), p.update(
        size=len(p["tokens"]), sha256=policy.tokens_digest(p["tokens"]))),
     "not public (e.g. 'movie')"),
    (lambda p: p["tokens"].append("zzz"), "as many as its size says"),
    (lambda p: p.update(sha256="0" * 64), "do not match its sha256"),
    (lambda p: (p["tokens"].reverse()), "sorted, distinct"),
    (lambda p: (p["tokens"].append("whom"), p["tokens"].sort(), p.update(
        size=len(p["tokens"]), sha256=policy.tokens_digest(p["tokens"]))),
     "not a regular token of the bundle's tokenizer"),
])
def test_a_list_that_is_not_public_is_refused_in_one_line(tiny_policy_bundle, tmp_path, edit,
                                                          says):
    with pytest.raises(BundleError) as exc:
        _tampered(tiny_policy_bundle, tmp_path, edit)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_a_list_of_the_most_frequent_words_is_refused(minilm_bundle, tmp_path):
    """A server that sends the 4,096 most frequent word pieces as "public" is refused: a list
    may hold only the reference's function words and punctuation (threshold: not one word
    outside it)."""
    vocab = minilm_bundle.tokenizer.get_vocab(with_added_tokens=True)
    frequent = sorted(t for t, i in vocab.items() if 1996 <= i < 1996 + 4096)
    bad = {"name": "frequent", "source": "a hostile server", "size": len(frequent),
           "tokens": frequent, "sha256": policy.tokens_digest(frequent)}
    with pytest.raises(policy.PolicyError, match=r"word\(s\) that are not public"):
        policy.TokenPolicy.from_block(bad, vocab, minilm_bundle.regular_ids)


def test_a_public_word_is_public_only_as_a_whole_word(minilm_bundle):
    """"the", "in", "on", "by" begin names ("the ##rou ##x", "in ##ou ##ye", "on ##ass ##is",
    "by ##water"): there they are part of the name and never sent as public words."""
    b = minilm_bundle.with_policy("function-words")
    tok = b.text_tokenizer()
    ids = np.array(tok.encode("the report by theroux on inouye and onassis in bywater",
                              add_special_tokens=False).ids)
    pieces = [b.tokenizer.id_to_token(int(i)) for i in ids]
    mask = b.policy.public_mask(ids)
    public = [p for p, m in zip(pieces, mask, strict=True) if m]
    assert public == ["the", "by", "on", "and", "in"], pieces
    assert pieces.count("the") == 2 and pieces.count("on") == 2 and pieces.count("in") == 2
    # a truncated text whose last kept piece began a longer word
    the = np.array([b.tokenizer.token_to_id("the")])
    assert b.policy.public_mask(the).all() and not b.policy.public_mask(the, cut=True).any()


def test_the_coin_keeps_a_public_word_with_probability_one_minus_p():
    """Binomial: 200,000 public tokens at p = 0.3; the share kept is 0.7 within 6 standard
    errors (0.0062); a sampler that kept with probability p (0.3) or always fails."""
    public = np.ones(200_000, dtype=bool)
    public[::3] = False
    keep = policy.kept_public(public, 0.3, np.random.default_rng(5))
    assert not keep[~public].any()
    share = keep[public].mean()
    se = math.sqrt(0.7 * 0.3 / public.sum())
    assert abs(share - 0.7) < 6 * se
    assert not policy.kept_public(public, 1.0, np.random.default_rng(1)).any()
    assert policy.kept_public(public, 0.0, np.random.default_rng(1))[public].all()


def test_under_a_policy_other_tokens_are_privatized_exactly_as_without(tiny_bundle,
                                                                       tiny_policy_bundle):
    """No public word in the batch: no coin is drawn, and the output is the plain
    mechanism's for the same generator, to the bit (the noise stream is the same)."""
    words = [tiny_bundle.tokenizer.token_to_id(w) for w in ("movie", "film", "good", "dull")]
    ids = np.array(words * 25)
    plain = DChiText(tiny_bundle, 8.0).privatize_ids(ids, np.random.default_rng(3))
    pol = DChiText(tiny_policy_bundle, 8.0, public_p=0.3)
    got = pol.privatize_ids(ids, np.random.default_rng(3))
    assert np.array_equal(plain, got)
    # public words sent as they are: p = 0 keeps them all, the others still change
    the = tiny_bundle.tokenizer.token_to_id("the")
    mixed = np.array([the, words[0]] * 200)
    zero = DChiText(tiny_policy_bundle, 1.0, public_p=0.0).privatize_ids(
        mixed, np.random.default_rng(4))
    assert (zero[::2] == the).all() and (zero[1::2] != words[0]).mean() > 0.5


def test_the_embedding_mechanism_sends_a_kept_public_word_as_its_row(tiny_policy_bundle):
    b = tiny_policy_bundle
    the, movie = (b.tokenizer.token_to_id(w) for w in ("the", "movie"))
    m = DChiEmbedding(1.0, public_p=0.0, bundle=b)
    out = m.privatize_tokens(np.array([the, movie]), b, np.random.default_rng(0))
    assert np.array_equal(out[0], b.embeddings[the])
    assert not np.array_equal(out[1], b.embeddings[movie])
    assert m.params == {"eta": 1.0, "public_p": 0.0}


def test_public_p_needs_a_bundle_with_a_policy(tiny_bundle):
    with pytest.raises(ValueError, match="needs a bundle with a token policy"):
        DChiText(tiny_bundle, 8.0, public_p=0.3)
    with pytest.raises(ValueError, match="needs a bundle with a token policy"):
        create("dchi-embedding", {"eta": 8.0, "public_p": 0.3}, tiny_bundle)


def test_payload_params_say_the_policy_and_none_keeps_old_bytes(tiny_bundle, tiny_policy_bundle):
    from edge_agent import Privatizer

    p0 = Privatizer(tiny_bundle, DChiText(tiny_bundle, 8.0)).privatize(["the movie"])[0]
    assert b"public_p" not in p0.model_dump_json().encode()
    assert p0.params.model_dump() == {"eta": 8.0}
    p1 = Privatizer(tiny_policy_bundle, DChiText(tiny_policy_bundle, 8.0, public_p=0.3)
                    ).privatize(["the movie"])[0]
    assert p1.params.model_dump() == {"eta": 8.0, "public_p": 0.3}
    again = parse_payload(p1.model_dump_json())
    assert again.params.public_p == 0.3
    with pytest.raises(ValueError):
        parse_payload({**json.loads(p1.model_dump_json()), "params": {"eta": 8.0,
                                                                      "public_p": 1.5}})


def test_the_ledger_counts_public_words_and_charges_the_others():
    c = ledger.cost("dchi-text", {"eta": 10.0, "public_p": 0.3}, tokens=12, diameter=2.0,
                    public=5)
    assert (c.tokens, c.public, c.epsilon, c.metric) == (7, 5, 140.0, 70.0)
    both = ledger.total([c, c])
    assert (both.tokens, both.public) == (14, 10)
    assert ledger.compose([c]).families["dchi"].public == 5
    with pytest.raises(ValueError, match="only under a token policy"):
        ledger.cost("dchi-text", {"eta": 10.0}, tokens=12, diameter=2.0, public=5)
    with pytest.raises(ValueError, match="cannot exceed"):
        ledger.cost("dchi-text", {"eta": 10.0, "public_p": 0.3}, tokens=3, diameter=2.0,
                    public=5)


def test_the_guarantee_says_what_it_covers(tiny_policy_bundle):
    g = DChiText(tiny_policy_bundle, 8.0, public_p=0.3).guarantee(tiny_policy_bundle)
    line = summary(g)
    assert "on words outside the public list" in line
    assert f"the {tiny_policy_bundle.policy.size:,} public words of policy function-words are "\
           "sent unchanged with probability 0.7 and have no guarantee" in line
    assert g["policy"]["sent_unchanged"] == pytest.approx(0.7)
    assert "public words: none" in g["worst_case"]["epsilon_scope"]
    assert "public" not in summary(DChiText(tiny_policy_bundle, 8.0).guarantee(
        tiny_policy_bundle))


def test_the_floor_judges_the_words_outside_the_public_list(tiny_policy_bundle):
    b = tiny_policy_bundle
    m = DChiText(b, 8.0, public_p=0.3)
    drawn = floor_tokens(m, b)
    assert not b.policy.public[drawn].any()
    assert drawn.size == b.regular_ids.size - b.policy.size
    same, n = measure_unchanged(m, b, rng=np.random.default_rng(0))
    assert 0 < n and same <= n


def test_a_new_dchi_text_model_gets_the_default_policy_at_its_matched_eta():
    """The frontier's decision (bench/results/frontier.md): new dchi-text models on the
    packaged MiniLM get DEFAULT_POLICY on DEFAULT_TABLE at an eta measured at matched privacy,
    and their bundle is one the edges know (never measured by the text floor)."""
    from shared.policy import DEFAULT_P, DEFAULT_POLICY, NO_POLICY, POLICIES, policy_for_new_model
    from shared.table import DEFAULT_TABLE, MATCHED_ETA, candidate_key, matched_eta
    from shared.trust import KNOWN_BUNDLES, known_name

    assert DEFAULT_POLICY in POLICIES
    assert policy_for_new_model("dchi-text", None, bundle_given=False) == DEFAULT_POLICY
    assert policy_for_new_model("dchi-text", None, bundle_given=True) == NO_POLICY
    assert policy_for_new_model("dchi-text", "none", bundle_given=False) == NO_POLICY
    assert policy_for_new_model("dchi-embedding", None, bundle_given=False) == NO_POLICY
    assert candidate_key(DEFAULT_TABLE, DEFAULT_POLICY, DEFAULT_P) == "pca32-int8+function-words@0.3"
    eta = matched_eta(DEFAULT_TABLE, DEFAULT_POLICY, DEFAULT_P)
    assert eta is not None and eta < MATCHED_ETA["none"]
    assert matched_eta(DEFAULT_TABLE, DEFAULT_POLICY, 0.5) is None  # not measured
    assert matched_eta("none") == 65.0
    assert known_name(DEFAULT_TABLE, DEFAULT_POLICY) in KNOWN_BUNDLES
