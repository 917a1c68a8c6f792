"""Privatizer: tokenization and truncation policy, payloads of every mechanism, records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent import Privatizer
from edge_agent.encoder import SentenceEncoder
from edge_agent.privatizer import TextError, trim_pair
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
    [pl] = p.privatize(["good movie"], ["bad plot !"], rng=rng())
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


def test_word_dropout_rate(tiny_enc_bundle):
    """Each word piece is dropped with probability μ = 0.3; [CLS]/[SEP] never.
    2,000 pieces: the dropped share is within 0.05 of μ (about 5 standard deviations)."""
    p = Privatizer(tiny_enc_bundle, Laplace(1.0, word_dropout=0.3))
    items = p.tokenize(["the a movie film good bad great awful is was"] * 200)
    seqs, _ = p.sequences(items, rng(1))
    sp = tiny_enc_bundle.special_ids
    kept = sum(len(s) - 2 for s in seqs)
    assert all(s[0] == sp["cls"] and s[-1] == sp["sep"] for s in seqs)
    assert abs(1 - kept / 2000 - 0.3) < 0.05


@pytest.mark.parametrize("mech_name", ["laplace", "ome", "texthide"])
def test_vector_payloads(tiny_enc_bundle, mech_name):
    mech = {"laplace": Laplace(2.0), "ome": OME(1.0, 2.0, 16),
            "texthide": TextHide(4, 1, 16, seed=1)}[mech_name]
    p = Privatizer(tiny_enc_bundle, mech)
    payloads = p.privatize(["good movie", "bad plot"], ["fun", "dull"], rng=rng())
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
