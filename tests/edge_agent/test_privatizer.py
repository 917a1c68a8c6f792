"""Privatizer: tokenization and truncation policy, payloads of every mechanism, records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent import Privatizer
from edge_agent.privatize.encoder import SentenceEncoder
from edge_agent.privatize.privatizer import TextError, trim_pair
from shared.mechanisms import OME, DChiEmbedding, DChiText, Laplace, TextHide
from shared.payload import parse_payload, parse_record


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- truncation ---------------------------------------------------------------------------------
@given(st.integers(1, 300), st.integers(1, 300), st.integers(2, 400))
def test_trim_pair_matches_one_token_at_a_time(la, lb, budget):
    """Closed form == removing one token at a time from the longer segment (second on a tie)."""
    a, b = la, lb
    while a + b > budget:
        if a > b:
            a -= 1
        else:
            b -= 1
    assert trim_pair(la, lb, budget) == (a, b)


def test_single_text_keeps_first_tokens(tiny_bundle):
    p = Privatizer(tiny_bundle, "none", max_length=8)
    words = "the a movie film good bad great awful is was"
    [it] = p.tokenize([words])
    full = tiny_bundle.tokenizer.encode(words, add_special_tokens=False).ids
    assert it.ids_a.tolist() == full[:6] and it.n_before == len(full) and it.truncated


def test_pair_trims_longer_segment(tiny_bundle):
    p = Privatizer(tiny_bundle, "none", max_length=10)
    [it] = p.tokenize(["the a movie film good bad great awful"], ["fun dull"])
    assert it.segments == [5, 2]  # 8 + 2 > 7: the first (longer) segment is cut to 5
    payload = p.privatize_tokenized([it])[0]
    assert payload.segments == [5, 2] and payload.n_tokens == 7


def test_truncate_error_names_the_text(tiny_bundle):
    p = Privatizer(tiny_bundle, "none", max_length=6, truncate="error")
    with pytest.raises(TextError) as exc:
        p.tokenize(["good", "the a movie film good bad"])
    assert exc.value.index == 1 and exc.value.reason == "too_long"
    assert "text 2 has 6 tokens" in str(exc.value) and "at most 4" in str(exc.value)


def test_empty_text_is_an_error_or_none(tiny_bundle):
    p = Privatizer(tiny_bundle, "none")
    with pytest.raises(TextError, match="text 2 has no tokens"):
        p.tokenize(["good", "   "])
    assert p.tokenize(["good", ""], allow_empty=True)[1] is None


def test_special_token_text_is_plain_text(tiny_bundle):
    """A user typing "[SEP]" gets word pieces, never the special id (contract: no [CLS]/[SEP])."""
    p = Privatizer(tiny_bundle, "none")
    [it] = p.tokenize(["good [SEP] bad [CLS] [MASK] [PAD]"])
    assert not set(it.ids_a.tolist()) & set(tiny_bundle.special_ids.values()) - {
        tiny_bundle.special_ids["unk"]}


def test_invalid_arguments(tiny_bundle, minilm_bundle):
    with pytest.raises(ValueError, match="truncate"):
        Privatizer(tiny_bundle, "none", truncate="last")
    with pytest.raises(ValueError, match="max_length"):
        Privatizer(tiny_bundle, "none", max_length=10_000)
    with pytest.raises(ValueError, match="mechanism"):
        Privatizer(tiny_bundle, "dchi")
    with pytest.raises(ValueError, match="another bundle"):
        Privatizer(tiny_bundle, DChiText(minilm_bundle, 10.0))
    with pytest.raises(ValueError, match="encoder.onnx"):
        Privatizer(tiny_bundle, Laplace(1.0))


# -- token kinds --------------------------------------------------------------------------------
def test_none_payload_is_the_tokenizer_ids(minilm_bundle):
    p = Privatizer(minilm_bundle, "none")
    text = "a gripping, well-acted story"
    [payload] = p.privatize([text])
    assert payload.mechanism == "none"
    assert payload.data_array().tolist() == minilm_bundle.tokenizer.encode(
        text, add_special_tokens=False).ids


def test_dchi_text_payloads(minilm_bundle):
    mech = DChiText(minilm_bundle, 50.0)
    p = Privatizer(minilm_bundle, mech)
    texts = ["the emotions are raw", "ok", "a b c d e f g"]
    payloads = p.privatize(texts, rng=rng())
    regular = set(minilm_bundle.regular_ids.tolist())
    for text, pl in zip(texts, payloads, strict=True):
        again = parse_payload(pl.model_dump_json())
        assert again.mechanism == "dchi-text" and again.params.eta == 50.0
        assert again.bundle_id == minilm_bundle.bundle_id
        ids = again.data_array()
        assert len(ids) == len(minilm_bundle.tokenizer.encode(text, add_special_tokens=False).ids)
        assert set(ids.tolist()) <= regular
    # a seeded generator reproduces; fresh entropy does not (30 tokens at η=50)
    a = [x.data_array() for x in p.privatize(texts * 3, rng=rng(7))]
    b = [x.data_array() for x in p.privatize(texts * 3, rng=rng(7))]
    c = [x.data_array() for x in p.privatize(texts * 3)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dchi_embedding_payload_and_float16(tiny_bundle):
    p = Privatizer(tiny_bundle, DChiEmbedding(5.0), float_dtype="float16")
    [pl] = p.privatize(["good movie"], rng(), pairs=["bad plot !"])
    arr = pl.data_array()
    assert pl.embeddings.dtype == "float16" and arr.shape == (5, tiny_bundle.dim)
    assert pl.segments == [2, 3]
    ids = tiny_bundle.tokenizer.encode("good movie bad plot !", add_special_tokens=False).ids
    # noise of norm ~ n/η = 3.2 on average: the rows moved, by a plausible amount
    dist = np.linalg.norm(arr.astype(np.float64) - tiny_bundle.embeddings[ids], axis=1)
    assert (dist > 0.1).all() and (dist < 20).all()


# -- vector kinds -------------------------------------------------------------------------------
def test_encoder_batch_equals_one_by_one(tiny_enc_bundle):
    """Length-sorted padded batches give each sentence the vector it has alone."""
    enc = SentenceEncoder.from_bundle(tiny_enc_bundle, batch_size=3)
    p = Privatizer(tiny_enc_bundle, Laplace(1.0), encoder=enc)
    texts = ["good", "the movie was very fun and the actor great", "bad plot", "a",
             "this film is not boring , it is funny !", "love it"]
    items = p.tokenize(texts)
    seqs, types = p.sequences(items, rng())
    batch = enc.encode(seqs, types)
    alone = np.concatenate([enc.encode([s], [t]) for s, t in zip(seqs, types, strict=True)])
    assert batch.shape == (6, 16)
    np.testing.assert_allclose(batch, alone, atol=1e-5)
    assert not np.allclose(batch[0], batch[1])


def test_sequences_have_cls_sep_and_token_types(tiny_enc_bundle):
    p = Privatizer(tiny_enc_bundle, Laplace(1.0))
    sp = tiny_enc_bundle.special_ids
    [it] = p.tokenize(["good movie"], ["bad"])
    (seq,), (tt,) = p.sequences([it], rng())
    assert seq[0] == sp["cls"] and seq[3] == sp["sep"] and seq[-1] == sp["sep"]
    assert tt.tolist() == [0, 0, 0, 0, 1, 1]


DRAWS = 2000


def dropout_draws(bundle, text: str, mu: float, pair: str | None = None):
    """(word pieces of each word of ``text``, kept-piece sets of DRAWS sequences)."""
    p = Privatizer(bundle, Laplace(1.0, word_dropout=mu))
    enc = bundle.tokenizer.encode(text, add_special_tokens=False)
    words: dict[int, list[int]] = {}
    for piece, w in zip(enc.ids, enc.word_ids, strict=True):
        words.setdefault(w, []).append(piece)
    assert len(set(enc.ids)) == len(enc.ids)  # distinct pieces: a kept id names its position
    items = p.tokenize([text] * DRAWS, None if pair is None else [pair] * DRAWS)
    seqs, _ = p.sequences(items, rng(1))
    sp = bundle.special_ids
    assert all(s[0] == sp["cls"] and s[-1] == sp["sep"] for s in seqs)
    return list(words.values()), seqs


def test_word_dropout_drops_whole_words(minilm_enc_bundle):
    """DPNR word dropout is on words (Lyu et al. 2020 §3.3, Theorem 2): with μ = 0.5 the
    pieces of a many-piece word are always kept or dropped together, and each word is
    dropped at rate μ within 5 binomial standard errors (sqrt(μ(1-μ)/2000) = 0.011)."""
    mu = 0.5
    text = "good blorptastic987 movie, well-acted"
    words, seqs = dropout_draws(minilm_enc_bundle, text, mu)
    assert max(len(w) for w in words) >= 5  # "blorptastic987": b ##lor ##pta ##stic ##9 ...
    tol = 5 * (mu * (1 - mu) / DRAWS) ** 0.5
    for pieces in words:
        kept = np.array([[x in set(s[1:-1].tolist()) for x in pieces] for s in seqs])
        assert (kept.all(axis=1) | ~kept.any(axis=1)).all(), pieces  # all or nothing
        assert abs(1 - kept[:, 0].mean() - mu) <= tol, (pieces, kept[:, 0].mean())


def test_word_dropout_on_pairs_and_after_truncation(minilm_enc_bundle):
    """Both segments drop whole words; a word cut by truncation keeps its remaining pieces
    together; μ = 0 keeps everything."""
    mu = 0.3
    words, seqs = dropout_draws(minilm_enc_bundle, "fine blorptastic987", mu,
                                pair="vexquillion55 plot")
    sep = minilm_enc_bundle.special_ids["sep"]
    enc_b = minilm_enc_bundle.tokenizer.encode("vexquillion55 plot", add_special_tokens=False)
    multi_b = [i for i, w in zip(enc_b.ids, enc_b.word_ids, strict=True) if w == 0]
    assert len(multi_b) >= 3
    for s in seqs:
        first_sep = s.tolist().index(sep)
        second = set(s[first_sep + 1 : -1].tolist())
        assert len(second & set(multi_b)) in (0, len(multi_b))
        first = set(s[1:first_sep].tolist())
        assert len(first & set(words[1])) in (0, len(words[1]))
    p = Privatizer(minilm_enc_bundle, Laplace(1.0, word_dropout=0.5), max_length=5)
    [it] = p.tokenize(["good blorptastic987"])  # 3 pieces kept: good b ##lor
    assert it.words_a.tolist() == [0, 1, 1]
    g, b, lor = it.ids_a.tolist()
    seen = {tuple(s[1:-1].tolist()) for s in p.sequences([it] * 200, rng(2))[0]}
    assert seen == {(), (g,), (b, lor), (g, b, lor)}  # never b without ##lor
    p0 = Privatizer(minilm_enc_bundle, Laplace(1.0))
    [it] = p0.tokenize(["good blorptastic987"])
    assert it.words_a is None  # no word ids without dropout (the dchi hot path)
    assert p0.sequences([it], rng())[0][0].size == it.ids_a.size + 2


def test_privatize_signature_matches_design(tiny_enc_bundle, tiny_bundle):
    """ARCHITECTURE.md: ``privatize(texts, rng=None)``; pairs only by keyword."""
    p = Privatizer(tiny_bundle, DChiText(tiny_bundle, 5.0))
    a = p.privatize(["good movie", "bad plot"], rng(3))
    b = p.privatize(["good movie", "bad plot"], rng=rng(3))
    assert [x.data_array().tolist() for x in a] == [x.data_array().tolist() for x in b]
    with pytest.raises(TypeError):
        p.privatize(["good"], rng(3), ["bad"])
    recs = Privatizer(tiny_enc_bundle, Laplace(1.0)).privatize_records(
        ["good", "bad"], [1, 0], rng(4), pairs=["fun", "dull"], num_labels=2)
    assert [r.label for r in recs] == [1, 0] and recs[0].payload.mechanism == "laplace"
    with pytest.raises(TypeError):
        Privatizer(tiny_enc_bundle, Laplace(1.0)).privatize_records(["good"], [1], rng(4),
                                                                    ["fun"])


@pytest.mark.parametrize("mech_name", ["laplace", "ome", "texthide"])
def test_vector_payloads(tiny_enc_bundle, mech_name):
    mech = {"laplace": Laplace(2.0), "ome": OME(1.0, 2.0, 16),
            "texthide": TextHide(4, 1, 16, seed=1)}[mech_name]
    p = Privatizer(tiny_enc_bundle, mech)
    payloads = p.privatize(["good movie", "bad plot"], pairs=["fun", "dull"], rng=rng())
    for pl in payloads:
        again = parse_payload(pl.model_dump_json())
        assert again.mechanism == mech_name and again.params.model_dump() == mech.params
        assert again.bundle_id == tiny_enc_bundle.bundle_id
        assert again.data_array().shape == ((160,) if mech_name == "ome" else (16,))


def test_dim_mismatch_refused(tiny_enc_bundle):
    with pytest.raises(ValueError, match="dim=8"):
        Privatizer(tiny_enc_bundle, OME(1.0, 2.0, 8))


def test_records_int_labels_and_texthide_soft_labels(tiny_enc_bundle):
    texts = ["good", "bad movie", "fun plot", "dull story", "great actor", "awful film"]
    labels = [1, 0, 1, 0, 1, 0]
    recs = Privatizer(tiny_enc_bundle, Laplace(1.0)).privatize_records(texts, labels, rng=rng())
    assert [r.label for r in recs] == labels
    th = Privatizer(tiny_enc_bundle, TextHide(4, 3, 16, seed=0))
    with pytest.raises(ValueError, match="k > 1"):
        th.privatize(texts)
    recs = th.privatize_records(texts, labels, num_labels=3, rng=rng())
    for r in recs:
        parse_record(r.model_dump_json())
        assert len(r.label) == 3 and abs(sum(r.label) - 1) < 1e-9 and r.label[2] == 0
    with pytest.raises(ValueError, match=r"labels must be in \[0, 2\)"):
        th.privatize_records(texts, [0, 1, 2, 0, 1, 0], num_labels=2)
