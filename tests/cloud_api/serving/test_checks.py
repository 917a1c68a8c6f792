"""Payload checks before queueing: each refusal names what differs and never repeats
payload data."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from cloud_api.errors import PayloadMismatch
from cloud_api.serving import BundleStore, ServedModels
from cloud_api.serving.checks import PayloadChecker
from shared.payload import make_payload, parse_payload
from tests.cloud_api.serving.conftest import ETA, FAST, add_version, run, settings_for
from tests.models.conftest import sentiment_texts, token_records, vector_records


def config_of(path) -> dict:
    return json.loads((path / "config.json").read_text())


@pytest.fixture(scope="module")
def text_checker(trained, bundle) -> PayloadChecker:
    return PayloadChecker(config_of(trained["a"]), bundle)


@pytest.fixture(scope="module")
def embedding_checker(tmp_path_factory, bert_dir, bundle) -> PayloadChecker:
    from models.training.experiment import train_from_records

    texts, _, labels = sentiment_texts(8)
    recs = token_records(bundle, "dchi-embedding", texts, labels, eta=ETA)
    res = train_from_records(recs, tmp_path_factory.mktemp("emb") / "m", bundle=bundle,
                             base=bert_dir, cfg=FAST)
    return PayloadChecker(config_of(res.model_dir), bundle)


@pytest.fixture(scope="module")
def vector_checker(tmp_path_factory, bundle) -> PayloadChecker:
    from models.training.experiment import train_from_records

    recs = vector_records(bundle.bundle_id, "laplace", 8, dim=24)
    res = train_from_records(recs, tmp_path_factory.mktemp("vec") / "m", bundle=bundle,
                             cfg=replace(FAST, hidden=(8,)))
    return PayloadChecker(config_of(res.model_dir), bundle)


def ids_payload(bundle, ids, eta=ETA, bundle_id=None, mechanism="dchi-text", segments=None):
    return make_payload(mechanism, {"eta": eta} if mechanism != "none" else {},
                        bundle_id or bundle.bundle_id, np.asarray(ids), segments)


def regular(bundle, n: int) -> np.ndarray:
    return bundle.regular_ids[np.arange(n) % bundle.regular_ids.size]


def refusal(checker: PayloadChecker, payload) -> str:
    with pytest.raises(PayloadMismatch) as err:
        checker.check([payload])
    assert err.value.status == 422 and err.value.kind == "payload-mismatch"
    return err.value.detail


def test_a_matching_payload_passes(text_checker, bundle, records):
    text_checker.check([r.payload for r in records])


def test_other_eta_names_both_values(text_checker, bundle):
    detail = refusal(text_checker, ids_payload(bundle, regular(bundle, 4), eta=60.0))
    assert detail == "payloads[0]: eta 60 sent, model serves eta 50"


def test_other_mechanism(text_checker, bundle):
    detail = refusal(text_checker, ids_payload(bundle, regular(bundle, 4), mechanism="none"))
    assert detail == "payloads[0]: mechanism none sent, model serves dchi-text"


def test_other_bundle_names_both_ids_and_where_to_fetch(text_checker, bundle):
    other = "ab" * 32
    detail = refusal(text_checker, ids_payload(bundle, regular(bundle, 4), bundle_id=other))
    assert detail.startswith(f"payloads[0]: bundle {other[:12]}… sent, model serves "
                             f"{bundle.bundle_id[:12]}…")
    assert f"/v1/bundles/{bundle.bundle_id}" in detail


def test_the_index_of_the_first_bad_payload_is_named(text_checker, bundle, records):
    bad = ids_payload(bundle, regular(bundle, 4), eta=65.0)
    with pytest.raises(PayloadMismatch, match=r"^payloads\[2\]: eta 65 sent"):
        text_checker.check([records[0].payload, records[1].payload, bad])



def test_bad_ids_name_their_payload_and_come_in_request_order(text_checker, bundle, records):
    """The ids of a request are checked in one pass; a refusal still names the first payload
    that does not fit, whether its ids or its parameters are wrong."""
    ok = [r.payload for r in records[:2]]
    bad_ids = ids_payload(bundle, np.concatenate([regular(bundle, 3),
                                                  [bundle.special_ids["cls"]]]))
    bad_eta = ids_payload(bundle, regular(bundle, 4), eta=65.0)
    with pytest.raises(PayloadMismatch, match=r"^payloads\[2\]: 1 token id\(s\) are special"):
        text_checker.check([*ok, bad_ids, bad_eta])
    with pytest.raises(PayloadMismatch, match=r"^payloads\[2\]: eta 65 sent"):
        text_checker.check([*ok, bad_eta, bad_ids])

def test_special_and_unused_ids_are_refused_without_echoing_them(text_checker, bundle):
    special = bundle.special_ids["cls"]
    unused = bundle.meta["unused_ids"][0]
    for bad in (special, unused):
        ids = np.concatenate([regular(bundle, 3), [bad]])
        detail = refusal(text_checker, ids_payload(bundle, ids))
        assert detail == ("payloads[0]: 1 token id(s) are special or [unused] ids, not "
                          "regular tokens (dchi-text payloads carry only word pieces; the "
                          "server adds [CLS] and [SEP])")  # which id, or where: not said


def test_ids_outside_the_vocabulary(text_checker, bundle):
    ids = np.concatenate([regular(bundle, 3), [bundle.vocab_size + 5, bundle.vocab_size]])
    detail = refusal(text_checker, ids_payload(bundle, ids))
    assert detail == (f"payloads[0]: 2 token id(s) outside the model's vocabulary "
                      f"[0, {bundle.vocab_size}) (a payload of another bundle?)")


def test_more_tokens_than_the_model_reads(text_checker, bundle):
    detail = refusal(text_checker, ids_payload(bundle, regular(bundle, 127)))
    assert detail == ("payloads[0]: 127 tokens sent, model serves at most 126 "
                      "(max_length 128 less [CLS] and [SEP])")
    text_checker.check([ids_payload(bundle, regular(bundle, 126))])
    pair = ids_payload(bundle, regular(bundle, 126), segments=[63, 63])
    assert "at most 125" in refusal(text_checker, pair)


def test_the_servers_token_limit(trained, bundle):
    checker = PayloadChecker(config_of(trained["a"]), bundle, max_tokens_setting=10)
    detail = refusal(checker, ids_payload(bundle, regular(bundle, 11)))
    assert detail.endswith("11 tokens sent, model serves at most 10 (the server's "
                           "tokens-per-payload limit)")
    assert checker.limits().max_tokens == 10


def test_embedding_dimension(embedding_checker, bundle):
    rows = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    payload = make_payload("dchi-embedding", {"eta": ETA}, bundle.bundle_id, rows)
    assert refusal(embedding_checker, payload) == ("payloads[0]: dimension 8 sent, model "
                                                   "serves 16")


def test_vector_dimension_and_laplace_parameters(vector_checker, bundle):
    params = {"epsilon": 1000.0, "calibration": "coordinate", "word_dropout": 0.0}
    vec = np.random.default_rng(0).random(16).astype(np.float32)
    payload = make_payload("laplace", params, bundle.bundle_id, vec)
    assert refusal(vector_checker, payload) == "payloads[0]: dimension 16 sent, model serves 24"
    other = make_payload("laplace", {**params, "calibration": "vector", "epsilon": 2.0},
                         bundle.bundle_id, np.zeros(24, np.float32))
    assert refusal(vector_checker, other) == (
        "payloads[0]: calibration vector sent, model serves calibration coordinate; "
        "epsilon 2 sent, model serves epsilon 1000")


def test_float_values_a_model_cannot_read_are_refused(embedding_checker, vector_checker,
                                                      bundle):
    """Finite values so large that a sound model's float32 arithmetic would overflow (NaN
    scores: issue 34) are a bad input, 422, at MAX_ABS_VALUE and not below; float16 cannot
    reach it."""
    from cloud_api.serving.checks import MAX_ABS_VALUE

    params = {"epsilon": 1000.0, "calibration": "coordinate", "word_dropout": 0.0}
    for checker, make in (
            (embedding_checker, lambda v, dt=np.float32: make_payload(
                "dchi-embedding", {"eta": ETA}, bundle.bundle_id, np.full((3, 16), v, dt))),
            (vector_checker, lambda v, dt=np.float32: make_payload(
                "laplace", params, bundle.bundle_id, np.full(24, v, dt)))):
        checker.check([make(MAX_ABS_VALUE), make(-MAX_ABS_VALUE), make(6e4, np.float16)])
        for v in (MAX_ABS_VALUE * 1.01, -3e38):
            why = refusal(checker, make(v))
            assert "magnitude above 1e+12" in why and "3e+38" not in why


def test_limits_parse_request_bodies_for_the_model(text_checker, vector_checker, bundle):
    lim = text_checker.limits()
    assert (lim.max_tokens, lim.vocab_size) == (126, bundle.vocab_size)
    assert vector_checker.limits().vector_dim == 24
    too_long = ids_payload(bundle, regular(bundle, 127)).model_dump(mode="json")
    with pytest.raises(ValueError, match="number of tokens"):
        parse_payload(too_long, lim)


def test_registry_refuses_before_queueing(home, trained, bundle):
    add_version(home, "sent", trained["a"])

    async def main():
        served = ServedModels(settings_for(home), home, BundleStore(home))
        await served.start()
        batcher = served.batcher_of("sent")
        with pytest.raises(PayloadMismatch, match="eta 60 sent, model serves eta 50"):
            await served.predict("sent", [ids_payload(bundle, regular(bundle, 3), eta=60.0)])
        nothing_queued = (batcher.queued, batcher.batches)  # refused before the queue
        assert served.limits_for("sent").max_tokens == 126
        await served.stop()
        return nothing_queued

    assert run(main()) == (0, 0)
