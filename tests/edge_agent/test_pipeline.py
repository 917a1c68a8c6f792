"""edge_agent.privatize.pipeline.ahead: order, errors at their position, early stop; and the CLI's
streamed output against the one-batch-at-a-time reference."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import orjson
import pytest

from edge_agent.privatize.pipeline import ahead
from shared.payload import Record, make_payload


def test_results_in_order_from_one_worker_thread():
    seen_threads = set()

    def stage(x):
        seen_threads.add(threading.current_thread().name)
        time.sleep(0.001 * (x % 3))  # uneven work must not reorder anything
        return x * x

    assert list(ahead(range(50), stage, depth=3)) == [x * x for x in range(50)]
    assert seen_threads == {"privbert-ahead"}


def test_stage_error_comes_after_the_results_before_it():
    def stage(x):
        if x == 4:
            raise ValueError("bad item 4")
        return x

    got = []
    with pytest.raises(ValueError, match="bad item 4"):
        for y in ahead(range(10), stage):
            got.append(y)
    assert got == [0, 1, 2, 3]


def test_source_error_is_raised_in_the_consumer():
    def source():
        yield 1
        yield 2
        raise OSError("read failed")

    got = []
    with pytest.raises(OSError, match="read failed"):
        for y in ahead(source(), lambda x: x):
            got.append(y)
    assert got == [1, 2]


def test_closing_early_stops_the_worker():
    done = []

    def stage(x):
        done.append(x)
        return x

    gen = ahead(range(10_000), stage, depth=2)
    assert next(gen) == 0
    gen.close()
    n = len(done)
    time.sleep(0.05)
    assert len(done) == n  # nothing computed after close
    assert n <= 4  # at most the consumed item, the queue (2) and the one in hand
    assert not any(t.name == "privbert-ahead" for t in threading.enumerate())


def test_close_does_not_wait_for_a_blocked_source():
    """A source blocked on input (an open pipe) must not hang the consumer's exit."""
    release = threading.Event()

    def source():
        yield 1
        release.wait(10)  # a read that does not return
        yield 2

    gen = ahead(source(), lambda x: x, join_timeout=0.1)
    assert next(gen) == 1
    t = time.perf_counter()
    gen.close()
    assert time.perf_counter() - t < 2
    release.set()


def test_seeded_rng_consumed_in_order():
    """A stage drawing from one seeded generator gives the serial results."""
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    serial = [rng_a.random(x + 1).sum() for x in range(20)]
    threaded = list(ahead(range(20), lambda x: rng_b.random(x + 1).sum(), depth=2))
    assert threaded == serial


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        next(ahead([1], lambda x: x, depth=0))


@pytest.mark.parametrize("label", [None, 1, "positive", [0.25, 0.75]])
@pytest.mark.parametrize("mechanism", ["dchi-embedding", "dchi-text", "ome"])
def test_orjson_lines_equal_pydantic_dump(mechanism, label):
    """The CLI writes orjson.dumps(record.model_dump()): the same JSON document as
    model_dump_json, and it parses back to the same record."""
    rng = np.random.default_rng(0)
    data = {"dchi-embedding": rng.standard_normal((7, 16)),
            "dchi-text": rng.integers(0, 1000, 9),
            "ome": rng.integers(0, 2, 40)}[mechanism]
    params = {"eta": 5.0} if mechanism != "ome" else {"epsilon": 1.0, "lam": 2.0,
                                                       "int_bits": 4, "frac_bits": 5}
    rec = Record(payload=make_payload(mechanism, params, "ab" * 32, data), label=label)
    fast = orjson.dumps(rec.model_dump(exclude_none=True))
    slow = rec.model_dump_json(exclude_none=True)
    assert json.loads(fast) == json.loads(slow)
    assert Record.model_validate_json(fast) == rec


def test_chained_stages_keep_order_and_close_together():
    got = list(ahead(ahead(range(30), lambda x: x + 1, depth=2), lambda y: y * 10))
    assert got == [(x + 1) * 10 for x in range(30)]

    def workers() -> int:
        return sum(t.name == "privbert-ahead" for t in threading.enumerate())

    before = workers()
    inner = ahead(range(10_000), lambda x: x)  # held here, so not closed by refcounting
    gen = ahead(inner, lambda y: y)
    assert next(gen) == 0
    assert workers() == before + 2
    gen.close()
    deadline = time.monotonic() + 2
    while workers() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    # without the explicit close the inner worker stays blocked on its full queue
    assert workers() == before
