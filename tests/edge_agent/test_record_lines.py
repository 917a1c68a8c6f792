"""edge_agent.privatize.record_lines: the CLI's JSONL lines of token records are byte for byte
orjson.dumps(Record(payload, label).model_dump(exclude_none=True)), and a batch that breaks
a payload rule raises the models' own error."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from pydantic import ValidationError

from edge_agent.privatize.privatizer import Privatizer, labelled
from edge_agent.privatize.record_lines import token_record_lines
from shared.arrays import Limits
from shared.mechanisms import DChiEmbedding
from shared.payload import make_payloads, parse_record

TEXTS = ["a gripping story", "dull", "the plot, at best, is thin", "x"]


def slow_lines(priv, items, data, labels):
    payloads = priv.payloads(items, data)
    return [orjson.dumps(r.model_dump(exclude_none=True)) + b"\n"
            for r in labelled(payloads, labels)]


@pytest.mark.parametrize("mechanism", ["dchi-embedding", "dchi-embedding-16", "none"])
@pytest.mark.parametrize("labels", [None, ["pos", "neg", "pos", "pos"], [1, 0, 1, 1],
                                    [[0.25, 0.75], [1.0, 0.0], [0.5, 0.5], [0.0, 1.0]]])
@pytest.mark.parametrize("pairs", [False, True])
def test_lines_equal_the_models(tiny_bundle, mechanism, labels, pairs):
    mech = "none" if mechanism == "none" else DChiEmbedding(5.0)
    priv = Privatizer(tiny_bundle, mech, float_dtype="float16" if mechanism.endswith("16")
                      else "float32")
    items = priv.tokenize(TEXTS, TEXTS[::-1] if pairs else None)
    data = priv.privatize_data(items, np.random.default_rng(0))
    fast = priv.record_lines(items, data, labels)
    assert fast == slow_lines(priv, items, data, labels)
    for line in fast:
        parse_record(line)


def test_dchi_text_lines_equal_the_models(tiny_bundle):
    """dchi-text payloads (int32 ids, η): the same bytes as the models'."""
    priv = Privatizer(tiny_bundle, "none")
    items = priv.tokenize(TEXTS, TEXTS)
    ids = priv.privatize_data(items)
    lengths, segs = [it.n_tokens for it in items], [it.segments for it in items]
    labels = [0, 1, 1, 0]
    payloads = make_payloads("dchi-text", {"eta": 65.0}, tiny_bundle.bundle_id, ids, lengths,
                             segs)
    slow = [orjson.dumps(r.model_dump(exclude_none=True)) + b"\n"
            for r in labelled(payloads, labels)]
    assert token_record_lines("dchi-text", {"eta": 65.0}, tiny_bundle.bundle_id, ids, lengths,
                              segs, labels) == slow


def test_a_batch_breaking_a_rule_raises_the_models_error(tiny_bundle):
    priv = Privatizer(tiny_bundle, "none")
    items = priv.tokenize(TEXTS)
    data = priv.privatize_data(items)
    lengths = [it.n_tokens for it in items]
    args = ("none", {}, tiny_bundle.bundle_id, data, lengths)
    with pytest.raises(ValidationError, match="segments"):  # segments that do not sum to L
        token_record_lines(*args, [[1], None, None, None], None)
    with pytest.raises(ValidationError, match="vocab_size"):
        token_record_lines(*args, [None] * 4, None, limits=Limits(vocab_size=3))
    with pytest.raises(ValidationError, match="number of tokens"):
        token_record_lines(*args, [None] * 4, None, limits=Limits(max_tokens=2))
    with pytest.raises(ValidationError, match="label"):
        token_record_lines(*args, [None] * 4, ["ok", "not a label!", "ok", "ok"])
    # and the same calls through the models agree that these are errors
    with pytest.raises(ValidationError):
        make_payloads("none", {}, tiny_bundle.bundle_id, data, lengths, [[1], None, None, None])


@pytest.mark.parametrize("labels", [None, [1, 0, 1, 1]])
def test_rows_are_the_models_payloads(tiny_bundle, labels):
    """What the device ledger charges and stores: each row's payload JSON and token count
    are the models' payload's, and the lines around stored JSON are the same records."""
    priv = Privatizer(tiny_bundle, DChiEmbedding(5.0))
    items = priv.tokenize(TEXTS, TEXTS[::-1])
    data = priv.privatize_data(items, np.random.default_rng(1))
    rows = priv.token_rows(items, data, labels)
    payloads = priv.payloads(items, data)
    assert rows.jsons == [orjson.dumps(p.model_dump(exclude_none=True)) for p in payloads]
    assert rows.n_tokens == [p.n_tokens for p in payloads]
    assert rows.payload.params.model_dump() == priv.params
    swapped = rows.jsons[::-1]  # the ledger's stored payloads in place of fresh ones
    assert [parse_record(ln).payload.model_dump() for ln in rows.lines(swapped)] == [
        p.model_dump() for p in payloads[::-1]]
