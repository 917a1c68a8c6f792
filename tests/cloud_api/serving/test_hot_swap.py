"""ServedModels against real tiny models: answers, batching, hot swap, broken versions."""

from __future__ import annotations

import asyncio
import gc
import shutil
import time
import weakref

import numpy as np
import pytest
from prometheus_client import REGISTRY

from cloud_api.errors import InvalidRequest, NotFound, Unavailable
from cloud_api.serving import BundleStore, ServedModels
from models.versions.model_version import load_model
from tests.cloud_api.serving.conftest import (
    add_broken_version,
    add_version,
    run,
    settings_for,
    until,
)


def make_served(home, **kw) -> ServedModels:
    return ServedModels(settings_for(home, **kw), home, BundleStore(home))


def reference(path, payloads) -> np.ndarray:
    """Probabilities of the model run alone, one payload at a time (no padding at all)."""
    mv = load_model(path)
    return np.concatenate([mv.predict_proba([p]) for p in payloads])


@pytest.mark.parametrize("workers", [1, 2])
def test_start_describe_and_answers_equal_the_model_alone(home, trained, records, bundle,
                                                          workers):
    add_version(home, "sent", trained["a"])
    payloads = [r.payload for r in records]
    want = reference(trained["a"], payloads)

    async def main():
        served = make_served(home, inference_workers=workers)
        assert served.ready() == (False, {"*": "models are loading"})
        await served.start()
        assert served.ready() == (True, {})
        [info] = served.describe()
        assert info["id"] == "sent" and info["task"] == "sent" and info["version"] == "v1"
        assert info["labels"] == ["neg", "pos"] and info["mechanism"] == "dchi-text"
        assert info["params"] == {"eta": 50.0} and info["bundle_id"] == bundle.bundle_id
        assert info["max_length"] == 128 and info["max_tokens"] == 126
        assert info["guarantee"]["worst_case"]["eta"] == 50.0
        assert info["metrics"]["n"] == 8 and "accuracy" in info["metrics"]
        # one request per payload, all at once: batches of more than one form
        singles = await asyncio.gather(*(served.predict("sent", [p]) for p in payloads))
        batcher = served.batcher_of("sent")
        assert batcher.largest_batch > 1 and batcher.batches < len(payloads)
        # one request with every payload: answers in input order
        whole = await served.predict("sent", payloads)
        await served.stop()
        return singles, whole

    singles, whole = run(main())
    got = np.concatenate([s.probs for s in singles])
    assert {s.version for s in singles} == {"v1"} and whole.version == "v1"
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(whole.probs, want, atol=1e-5)
    assert whole.labels == ["neg", "pos"]


def test_unknown_model_is_not_found(home, trained):
    async def main():
        served = make_served(home)
        await served.start()
        with pytest.raises(NotFound, match="nope"):
            await served.predict("nope", [])
        with pytest.raises(NotFound):
            served.limits_for("nope")
        await served.stop()

    run(main())


def _module_refs(served: ServedModels, model_id: str) -> list[weakref.ref]:
    return [weakref.ref(b.version.module) for b in served._served[model_id].backends]


def test_hot_swap_under_load_no_failures_and_old_version_released(home, trained, records):
    add_version(home, "sent", trained["a"])
    v2 = add_version(home, "sent", trained["b"], promote=False)
    payloads = [r.payload for r in records]
    want = {"v1": reference(trained["a"], payloads), "v2": reference(trained["b"], payloads)}

    async def main():
        served = make_served(home, max_wait_ms=2.0, inference_workers=2)
        await served.start()
        old_modules = _module_refs(served, "sent")
        answers, failures = [], []
        promoted_at: list[float] = []
        stop = asyncio.Event()

        async def client(c: int):
            j = c
            while not stop.is_set():
                j = (j + 7) % len(payloads)
                sent = time.monotonic()
                try:
                    pred = await served.predict("sent", [payloads[j]])
                except Exception as exc:  # any failure counts
                    failures.append(repr(exc))
                    await asyncio.sleep(0)  # a failure that never awaits must not spin
                    continue
                answers.append((sent, pred.version, j, pred.probs[0]))

        tasks = [asyncio.create_task(client(c)) for c in range(8)]
        await until(lambda: len(answers) >= 60 or failures, "60 answers")  # failures: below
        await served.promote("sent", v2)
        promoted_at.append(time.monotonic())
        await until(lambda: sum(v == "v2" for _, v, _, _ in answers) >= 60 or failures,
                    "60 answers from v2")
        stop.set()
        await asyncio.gather(*tasks)
        await served.wait_retired()
        loaded = served.loaded()
        await asyncio.sleep(0)
        gc.collect()
        alive = [m() is not None for m in old_modules]
        await served.stop()
        return answers, failures, promoted_at[0], loaded, alive

    answers, failures, t_promote, loaded, alive = run(main())
    assert failures == []
    assert {v for _, v, _, _ in answers} == {"v1", "v2"}
    for _, version, j, probs in answers:  # each answer is the named version's own
        np.testing.assert_allclose(probs, want[version][j], atol=1e-5)
    assert all(v == "v2" for sent, v, _, _ in answers if sent > t_promote)
    assert home.promoted("sent") == "v2"
    assert loaded == [("sent", "v2")]
    assert alive == [False, False], "a replaced version's module is still referenced"
    assert REGISTRY.get_sample_value("privbert_model_loaded",
                                     {"model": "sent", "version": "v1"}) is None


def test_promotion_by_another_process_is_picked_up(home, trained, records):
    add_version(home, "sent", trained["a"])
    v2 = add_version(home, "sent", trained["b"], promote=False)

    async def main():
        served = make_served(home, reload_interval_s=0.05)
        await served.start()
        home.promote("sent", v2)  # what the CLI or a retraining worker does
        await until(lambda: served.served_version("sent") == "v2", "v2 served")
        pred = await served.predict("sent", [records[0].payload])
        # a new model promoted by another process appears as well
        add_version(home, "other", trained["a"])
        await until(lambda: "other" in {m["id"] for m in served.describe()}, "model other served")
        ids = [m["id"] for m in served.describe()]
        await served.stop()
        return pred, ids

    pred, ids = run(main())
    assert pred.version == "v2"
    assert ids == ["other", "sent"]


def _failures(model: str) -> float:
    return REGISTRY.get_sample_value("privbert_model_load_failure_total", {"model": model}) or 0


def test_broken_version_promoted_elsewhere_keeps_the_old_one_serving(home, trained, records,
                                                                     tmp_path):
    add_version(home, "sent", trained["a"])
    v2 = add_broken_version(home, "sent", trained["a"], promote=False)
    before = _failures("sent")
    with pytest.raises(InvalidRequest, match="model.safetensors does not match its SHA-256"):
        home.promote("sent", v2)  # a promotion checks the version whole first
    assert home.promoted("sent") == "v1"

    async def main():
        served = make_served(home)
        await served.start()
        with home.promotion_lock("sent"):  # a pointer moved without that check
            home.write_promoted("sent", v2)
        await served.refresh()
        ok, problems = served.ready()
        pred = await served.predict("sent", [records[0].payload])
        await served.refresh()  # a known failure is not retried on every poll
        after_two_polls = _failures("sent")
        # the operator restores the file and promotes the same version again
        shutil.copy(trained["a"] / "model.safetensors", home.version_dir("sent", v2))
        home.promote("sent", v2)
        await served.refresh()
        mended = (await served.predict("sent", [records[0].payload])).version, served.ready()
        await served.stop()
        return ok, problems, pred, after_two_polls, mended

    ok, problems, pred, after, mended = run(main())
    assert mended == ("v2", (True, {}))
    assert pred.version == "v1"
    assert ok is True  # the model is still served ...
    assert problems["sent"].startswith("v2 failed to load") and "serving v1" in problems["sent"]
    assert "model.safetensors does not match its SHA-256 in manifest.json" in problems["sent"]
    assert after == before + 1


def test_broken_version_promoted_through_the_api_is_refused(home, trained, records, tmp_path):
    add_version(home, "sent", trained["a"])
    v2 = add_broken_version(home, "sent", trained["a"], promote=False)

    async def main():
        served = make_served(home)
        await served.start()
        with pytest.raises(InvalidRequest, match="v2 of model sent cannot be served"):
            await served.promote("sent", v2)
        with pytest.raises(NotFound):
            await served.promote("sent", "v9")
        ok, problems = served.ready()
        pred = await served.predict("sent", [records[0].payload])
        await served.stop()
        return ok, problems, pred

    ok, problems, pred = run(main())
    assert home.promoted("sent") == "v1" and pred.version == "v1"
    assert ok and problems["sent"].startswith("promotion to v2 failed")


def test_broken_version_at_start_with_nothing_else_is_not_ready(home, trained, records,
                                                                tmp_path):
    add_broken_version(home, "bad", trained["a"])
    add_version(home, "sent", trained["a"])

    async def main():
        served = make_served(home)
        await served.start()
        ok, problems = served.ready()
        with pytest.raises(Unavailable, match="not loaded"):
            await served.predict("bad", [records[0].payload])
        pred = await served.predict("sent", [records[0].payload])  # the others serve
        await served.stop()
        return ok, problems, pred

    ok, problems, pred = run(main())
    assert not ok and "v1 failed to load" in problems["bad"] and "nothing served" in problems["bad"]
    assert "sent" not in problems and pred.version == "v1"


def test_mechanism_none_is_served_only_when_allowed(home, tmp_path, bert_dir, bundle):
    from models.training.experiment import train_from_records
    from tests.cloud_api.serving.conftest import FAST
    from tests.models.conftest import sentiment_texts, token_records

    texts, _, labels = sentiment_texts(16)
    recs = token_records(bundle, "none", texts, labels)
    res = train_from_records(recs, tmp_path / "none", bundle=bundle, base=bert_dir, cfg=FAST)
    add_version(home, "plain", res.model_dir)

    async def main(allow: bool):
        served = make_served(home, allow_none=allow)
        await served.start()
        out = served.ready()
        if allow:
            out = (out, (await served.predict("plain", [recs[0].payload])).version)
        await served.stop()
        return out

    ok, problems = run(main(False))
    assert not ok and "PRIVBERT_ALLOW_NONE" in problems["plain"]
    (ok, problems), version = run(main(True))
    assert ok and version == "v1"


def test_stop_finishes_queued_requests_then_unloads(home, trained, records):
    add_version(home, "sent", trained["a"])
    payloads = [r.payload for r in records]

    async def main():
        served = make_served(home, max_batch_size=4)
        await served.start()
        tasks = [asyncio.create_task(served.predict("sent", [p])) for p in payloads]
        await asyncio.sleep(0)  # every request is queued
        queued = served.batcher_of("sent").queued
        await served.stop()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        with pytest.raises(Unavailable, match="shutting down"):
            await served.predict("sent", payloads[:1])
        return queued, results, served.loaded()

    queued, results, loaded = run(main())
    assert queued > 8
    assert all(not isinstance(r, BaseException) for r in results)
    assert loaded == []


def test_bundle_rebuilt_from_the_base_folder_when_missing(home, trained, bundle):
    shutil.rmtree(home.bundle_dir(bundle.bundle_id))
    add_version(home, "sent", trained["a"])

    async def main():
        served = make_served(home)
        await served.start()
        await served.stop()

    run(main())
    assert (home.bundle_dir(bundle.bundle_id) / "bundle.json").is_file()
