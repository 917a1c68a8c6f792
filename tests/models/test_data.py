"""models/training/data.py: TSV reading, records -> dataset, collation (token payloads: [CLS]/[SEP] added), buckets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.training.data import (
    collate,
    dataset_from_records,
    fit_segments,
    label_indices,
    label_names_from,
    length_buckets,
    read_labelled_tsv,
    read_records_jsonl,
)
from shared.payload import Record, make_payload
from tests.models.conftest import token_records, vector_records

BID = "ab" * 32
SPECIAL = {"pad": 0, "unk": 4, "cls": 5, "sep": 6, "mask": 7}


def test_read_single_and_pair_tsv(tmp_path):
    p = tmp_path / "a.tsv"
    p.write_text("sentence\tlabel\ngood film\t1\n \t0\nbad film\t0\n")
    d = read_labelled_tsv(p)
    assert d.texts == ["good film", "bad film"] and d.labels == ["1", "0"]
    assert d.pairs is None and d.skipped_empty == 1
    q = tmp_path / "b.tsv"
    q.write_text("label\tsentence_a\tsentence_b\nyes\tis it?\tit is.\n")
    d = read_labelled_tsv(q)
    assert d.texts == ["is it?"] and d.pairs == ["it is."] and d.labels == ["yes"]


@pytest.mark.parametrize("content, message", [
    ("text\tlabel\nx\t1\n", "header must be"),
    ("sentence\tlabel\nonly-one-column\n", "1 column(s)"),
    ("sentence\tlabel\nx\t\n", "empty label"),
])
def test_read_tsv_errors_name_the_file(tmp_path, content, message):
    p = tmp_path / "bad.tsv"
    p.write_text(content)
    with pytest.raises(ValueError, match="bad.tsv") as info:
        read_labelled_tsv(p)
    assert message in str(info.value)


def test_read_tsv_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_labelled_tsv(tmp_path / "nope.tsv")


def test_label_names_sort_numbers_as_numbers_and_unknown_labels():
    assert label_names_from(["10", "2", "1"]) == ["1", "2", "10"]
    assert label_names_from(["pos", "neg"]) == ["neg", "pos"]
    with pytest.raises(ValueError, match="'maybe'"):
        label_indices(["pos", "maybe"], ["neg", "pos"])


def test_collate_token_layout_single_and_pair():
    a = np.array([10, 11, 12])
    b = np.array([20, 21, 30])  # pair: a = [20, 21], b = [30]
    batch = collate([a, b], [None, (2, 1)], "dchi-text", SPECIAL, max_length=16)
    ids, att, tt = (batch[k].numpy() for k in ("input_ids", "attention_mask", "token_type_ids"))
    assert ids.tolist() == [[5, 10, 11, 12, 6, 0], [5, 20, 21, 6, 30, 6]]
    assert att.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    # token type 0 up to and including the first [SEP], 1 after
    assert tt.tolist() == [[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1]]


def test_collate_truncates_to_max_length_longer_segment_first():
    ids = np.arange(100, 120)  # a = 15 tokens, b = 5 tokens
    batch = collate([ids], [(15, 5)], "none", SPECIAL, max_length=12)  # 9 tokens allowed
    row = batch["input_ids"][0].tolist()
    assert len(row) == 12
    assert row == [5, 100, 101, 102, 103, 104, 6, 115, 116, 117, 118, 6]
    assert fit_segments(15, 5, 9) == (5, 4)  # the edge's rule: the second on a tie
    single = collate([np.arange(100, 120)], [None], "none", SPECIAL, max_length=8)
    assert single["input_ids"][0].tolist() == [5, 100, 101, 102, 103, 104, 105, 6]


def test_collate_embeddings_rows_and_mask():
    rows = np.arange(2 * 3, dtype=np.float32).reshape(2, 3)
    batch = collate([rows, rows[:1]], [None, None], "dchi-embedding", SPECIAL, max_length=16)
    assert batch["token_rows"].shape == (2, 4, 3)
    assert batch["row_mask"].tolist() == [[False, True, True, False],
                                          [False, True, False, False]]
    assert np.array_equal(batch["token_rows"][0, 1:3].numpy(), rows)
    assert batch["input_ids"][0].tolist()[0] == 5 and batch["input_ids"][0].tolist()[3] == 6
    assert batch["input_ids"][1].tolist()[:3] == [5, 0, 6]


def test_collate_vectors_and_bits():
    v = [np.ones(4, np.float32), np.zeros(4, np.float32)]
    assert collate(v, [None, None], "laplace", SPECIAL)["features"].shape == (2, 4)
    bits = [np.array([0, 1, 1, 0] * 5, dtype=np.uint8)]
    f = collate(bits, [None], "ome", SPECIAL)["features"]
    assert f.dtype.is_floating_point and f.tolist() == [[0.0, 1.0, 1.0, 0.0] * 5]


def test_dataset_from_records_fingerprint_labels_and_mixing(tiny_bert_bundle):
    texts = ["good movie", "bad plot", "the film was fun"]
    recs = token_records(tiny_bert_bundle, "none", texts, ["pos", "neg", "pos"])
    ds = dataset_from_records(recs, None)
    assert ds.label_names == ["neg", "pos"] and ds.targets.tolist() == [1, 0, 1]
    assert dataset_from_records(recs[::-1], None).fingerprint == ds.fingerprint
    relabel = [Record(payload=recs[0].payload, label="neg"), *recs[1:]]
    assert dataset_from_records(relabel, None).fingerprint != ds.fingerprint
    other = token_records(tiny_bert_bundle, "dchi-text", texts[:1], ["pos"])
    with pytest.raises(ValueError, match="mixes"):
        dataset_from_records(recs + other, None)
    with pytest.raises(ValueError, match="empty"):
        dataset_from_records([], None)
    with pytest.raises(ValueError, match="unknown label"):
        dataset_from_records(recs, ["neg", "neutral"])
    unlabelled = [Record(payload=recs[0].payload)]
    with pytest.raises(ValueError, match="no label"):
        dataset_from_records(unlabelled, ["neg", "pos"])


def test_dataset_soft_labels_and_params_check():
    soft = vector_records(BID, "texthide", 6)
    ds = dataset_from_records(soft, None)
    assert ds.soft and ds.targets.shape == (6, 2)
    np.testing.assert_allclose(ds.targets.sum(axis=1), 1.0, atol=1e-6)
    lap = vector_records(BID, "laplace", 2)
    other = make_payload("laplace", {"epsilon": 2.0, "calibration": "coordinate"}, BID,
                         np.zeros(24))
    with pytest.raises(ValueError, match="parameters"):
        dataset_from_records([*lap, Record(payload=other, label=0)], None)


def test_read_records_jsonl_reports_line(tmp_path):
    recs = vector_records(BID, "laplace", 3)
    p = tmp_path / "r.jsonl"
    lines = [r.model_dump_json() for r in recs]
    lines.insert(2, json.dumps({"payload": {"mechanism": "laplace"}, "label": 1}))
    p.write_text("\n".join(lines) + "\n\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:3: invalid record"):
        read_records_jsonl(p)
    p.write_text("\n".join(r.model_dump_json() for r in recs) + "\n")
    assert len(read_records_jsonl(p)) == 3 and len(read_records_jsonl(p, limit=2)) == 2


def test_length_buckets_cover_every_index_once():
    lengths = np.random.default_rng(0).integers(1, 50, size=103)
    for rng in (None, np.random.default_rng(1)):
        batches = list(length_buckets(lengths, 8, rng, pool=3))
        got = np.sort(np.concatenate(batches))
        assert got.tolist() == list(range(103))
        assert all(len(b) <= 8 for b in batches)
    sorted_pass = list(length_buckets(lengths, 8, None))
    flat = lengths[np.concatenate(sorted_pass)]
    assert (np.diff(flat) >= 0).all()


def test_dataset_from_store_pairs(tiny_bert_bundle):
    """The record store of the service hands (payload, label) pairs."""
    recs = token_records(tiny_bert_bundle, "none", ["good film", "bad plot"], ["pos", "neg"])
    pairs = [(r.payload, r.label) for r in recs]
    ds = dataset_from_records(pairs, ["neg", "pos"])
    assert ds.targets.tolist() == [1, 0]
    assert ds.fingerprint == dataset_from_records(recs, ["neg", "pos"]).fingerprint
    by_index = dataset_from_records([(r.payload, i) for i, r in enumerate(recs)], None)
    assert by_index.label_names == ["0", "1"] and by_index.targets.tolist() == [0, 1]
