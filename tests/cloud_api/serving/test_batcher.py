"""The micro-batcher over a real tiny model's forward, gated where a test needs the model
busy: queue bound, queue timeout, dropped clients, length buckets, token budget and the
backend's forward overhead, order, idle requests run inline."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from cloud_api.errors import Overloaded, Unavailable
from cloud_api.serving.backends import TorchBackend
from cloud_api.serving.batcher import Batcher
from cloud_api.serving.payload_queue import ClientGone, payload_length
from shared.payload import make_payload
from tests.cloud_api.serving.conftest import ETA, run, settings_for, until


class Gated:
    """The real backend's forward, held at a gate; records the lengths of every batch."""

    def __init__(self, backend: TorchBackend):
        self.backend = backend
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[int]] = []

    def __call__(self, payloads):
        self.batches.append([payload_length(p) for p in payloads])
        self.entered.set()
        if not self.gate.wait(30):
            raise TimeoutError("test gate never opened")
        return self.backend.forward(payloads)

    async def busy(self) -> None:
        """Wait until a forward is running (and held)."""
        assert await asyncio.to_thread(self.entered.wait, 30)


@pytest.fixture(scope="module")
def backend(trained, tmp_path_factory):
    from cloud_api.home import ModelHome

    return TorchBackend(trained["a"], settings_for(ModelHome(tmp_path_factory.mktemp("b"))))


def payload_of_length(bundle, n: int, seed: int = 0):
    rng = np.random.default_rng(seed + n)
    ids = rng.choice(bundle.regular_ids, size=n)
    return make_payload("dchi-text", {"eta": ETA}, bundle.bundle_id, ids)


def make(forward, **kw) -> Batcher:
    opts = dict(model_id="m", version="v1", max_batch_size=32, max_wait_ms=1.0)
    opts.update(kw)
    return Batcher(forward, **opts).start()


def test_full_queue_refuses_with_retry_after(backend, records):
    gated = Gated(backend)

    async def main():
        b = make(gated, max_queue_size=4, max_batch_size=1)
        first = asyncio.create_task(b.run([records[0].payload]))
        await gated.busy()
        waiting = asyncio.create_task(b.run([r.payload for r in records[1:5]]))  # 4 fit
        await until(lambda: b.queued == 4, "4 payloads queued")
        with pytest.raises(Overloaded) as err:
            await b.run([records[5].payload])
        gated.gate.set()
        got = await first, await waiting
        await b.drain()
        return err.value, got

    err, (first, waiting) = run(main())
    assert err.status == 429 and err.retry_after >= 1 and "full" in err.detail
    assert first.shape == (1, 2) and waiting.shape == (4, 2)


def test_request_waiting_too_long_gets_unavailable_and_never_runs(backend, records):
    gated = Gated(backend)

    async def main():
        b = make(gated, queue_timeout_s=0.3, max_batch_size=1)
        first = asyncio.create_task(b.run([records[0].payload]))
        await gated.busy()
        with pytest.raises(Unavailable) as err:
            await b.run([records[1].payload, records[2].payload])
        gated.gate.set()
        await first
        await b.drain()
        return err.value

    err = run(main())
    assert err.status == 503 and err.retry_after >= 1 and "waited 0.3 s" in err.detail
    assert gated.batches == [[payload_length(records[0].payload)]]  # only the first ran


def test_disconnected_and_cancelled_requests_are_not_run(backend, bundle):
    gated = Gated(backend)
    p = {n: payload_of_length(bundle, n) for n in (3, 4, 5, 6)}

    async def still_there():
        return False

    async def main():
        b = make(gated, max_batch_size=8)
        first = asyncio.create_task(b.run([p[3]]))
        await gated.busy()
        gone = asyncio.create_task(b.run([p[4]], is_disconnected=lambda: True))
        cancelled = asyncio.create_task(b.run([p[5]]))
        kept = asyncio.create_task(b.run([p[6]], is_disconnected=still_there))
        await until(lambda: b.queued == 3, "3 requests queued")
        cancelled.cancel()
        gated.gate.set()
        await first
        with pytest.raises(ClientGone):
            await gone
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        answer = await kept
        await b.drain()
        return answer, b.dropped

    answer, dropped = run(main())
    assert answer.shape == (1, 2) and dropped == 1
    assert gated.batches == [[5], [8]]  # lengths + [CLS]/[SEP]: only 3 and 6 ran


@pytest.mark.parametrize("lengths, max_batch_size, want", [
    # arrival order alternates short and long: the shorts go together, then the longs
    ([4, 30, 5, 31, 6, 32, 7, 33], 4, [[6, 7, 8, 9], [32, 33, 34, 35]]),
    # one long payload waits for its own forward rather than pad the short ones
    ([5, 6, 60, 7, 8, 6], 32, [[7, 8, 9, 10, 8], [62]]),
], ids=["alternating", "one-long"])
def test_batches_are_built_from_similar_lengths(backend, bundle, lengths, max_batch_size,
                                                want):
    gated = Gated(backend)

    async def main():
        b = make(gated, max_batch_size=max_batch_size)
        first = asyncio.create_task(b.run([payload_of_length(bundle, 10)]))
        await gated.busy()
        tasks = [asyncio.create_task(b.run([payload_of_length(bundle, n)])) for n in lengths]
        await until(lambda: b.queued == len(lengths), "every payload queued")
        gated.gate.set()
        await first
        await asyncio.gather(*tasks)
        await b.drain()

    run(main())
    assert gated.batches[1:] == want  # lengths + [CLS]/[SEP], each batch in arrival order


def test_best_groups_trade_padding_against_forwards():
    from cloud_api.serving.payload_queue import best_groups

    equal = best_groups([5] * 10, 4, 10_000)
    assert len(equal) == 3 and all(j - i <= 4 for i, j in equal)  # as few forwards as fit
    assert best_groups([5, 6, 7, 60], 32, 10_000) == [(0, 3), (3, 4)]
    assert best_groups([10, 11, 12, 13], 32, 10_000) == [(0, 4)]  # padding < a forward
    assert best_groups([30, 30, 30], 32, 50) == [(0, 1), (1, 2), (2, 3)]  # token budget
    assert best_groups([100], 32, 50) == [(0, 1)]  # one payload always fits


def test_token_budget_caps_the_batch(backend, bundle):
    gated = Gated(backend)
    gated.gate.set()

    async def main():
        b = make(gated, max_batch_size=32, max_batch_tokens=20, max_wait_ms=50)
        await asyncio.gather(*(b.run([payload_of_length(bundle, 7, s)]) for s in range(6)))
        await b.drain()

    run(main())
    assert all(len(x) * max(x) <= 20 for x in gated.batches)
    assert sorted(len(x) for x in gated.batches) == [2, 2, 2]


def test_one_request_split_over_batches_answers_in_input_order(backend, bundle):
    lengths = [12, 3, 25, 4, 3, 18, 7, 30, 2, 9]
    payloads = [payload_of_length(bundle, n) for n in lengths]
    want = np.concatenate([backend.forward([p]) for p in payloads])

    async def main():
        b = make(backend.forward, max_batch_size=3)
        got = await b.run(payloads)
        await b.drain()
        return got, b.batches

    got, batches = run(main())
    assert batches >= 4
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_two_workers_run_two_batches_at_once(backend, trained, tmp_path, records):
    from cloud_api.home import ModelHome

    replica = TorchBackend(trained["a"], settings_for(ModelHome(tmp_path)))
    gates = [Gated(backend), Gated(replica)]
    payloads = [r.payload for r in records]

    async def main():
        b = make(gates, max_batch_size=4)
        first = asyncio.create_task(b.run(payloads[:4]))
        await gates[0].busy()
        second = asyncio.create_task(b.run(payloads[4:8]))
        await gates[1].busy()  # the second batch runs while the first is held
        for g in gates:
            g.gate.set()
        got = np.concatenate([await first, await second])
        await b.drain()
        return got

    got = run(main())
    np.testing.assert_allclose(got, backend.forward(payloads[:8]), atol=1e-5)
    assert [len(g.batches) for g in gates] == [1, 1]


def test_under_load_the_next_batch_waits_for_the_returning_clients(backend, records):
    """After a batch of 8, the collector waits (up to max_wait) for about as many more
    instead of sending the 4 already there alone; it goes once 7 (the decayed load) wait."""
    import time

    gated = Gated(backend)
    payloads = [r.payload for r in records]

    async def main():
        b = make(gated, max_wait_ms=5000)
        first = [asyncio.create_task(b.run([p])) for p in payloads[:8]]
        await gated.busy()
        early = [asyncio.create_task(b.run([p])) for p in payloads[8:12]]
        gated.gate.set()
        await asyncio.gather(*first)
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        late = [asyncio.create_task(b.run([p])) for p in payloads[12:15]]
        await asyncio.gather(*early, *late)
        took = time.perf_counter() - t0
        await b.drain()
        return took

    took = run(main())
    assert [len(x) for x in gated.batches] == [8, 7]
    assert took < 4.0  # went when 7 were there, not at max_wait


def test_lone_client_does_not_wait_for_company(backend, records):
    """After a batch of one, the next request runs at once (max_wait is not spent)."""
    import time

    async def main():
        b = make(backend.forward, max_wait_ms=2000)
        await b.run([records[0].payload])
        t0 = time.perf_counter()
        for r in records[1:6]:
            await b.run([r.payload])
        took = time.perf_counter() - t0
        await b.drain()
        return took

    # five requests of a few ms each; one max_wait alone would be 2 s (a wide margin for a
    # busy machine, at no cost unless the batcher does wait)
    assert run(main()) < 2.0


def test_drain_finishes_queued_work_and_refuses_new(backend, records):
    async def main():
        b = make(backend.forward, max_batch_size=2)
        tasks = [asyncio.create_task(b.run([r.payload])) for r in records[:10]]
        await asyncio.sleep(0)
        await b.drain()
        with pytest.raises(Unavailable, match="being unloaded"):
            await b.run([records[0].payload])
        return await asyncio.gather(*tasks)

    assert len(run(main())) == 10


def test_a_failing_forward_fails_its_requests_not_the_batcher(backend, records):
    from cloud_api.errors import InferenceFailed

    calls = []

    def flaky(payloads):
        calls.append(len(payloads))
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return backend.forward(payloads)

    async def main():
        b = make(flaky, max_batch_size=2)
        with pytest.raises(InferenceFailed) as err:  # 4 payloads: the first batch of 2 fails
            await b.run([r.payload for r in records[:4]])
        left = b.queued  # the other 2 are taken out of the queue at once: nobody reads them
        ok = await b.run([records[4].payload])
        await b.drain()
        return err.value, left, ok

    err, left, ok = run(main())
    assert err.status == 500 and "RuntimeError" in err.detail and "memory" not in err.detail
    assert left == 0 and calls == [2, 1]
    assert ok.shape == (1, 2)


# -- idle requests inline, and the backend's forward overhead -----------------------------------
class Recording:
    """The real forward; records which thread ran each batch and its size."""

    def __init__(self, backend: TorchBackend):
        self.backend = backend
        self.calls: list[tuple[str, int]] = []

    def __call__(self, payloads):
        self.calls.append((threading.current_thread().name, len(payloads)))
        return self.backend.forward(payloads)


def test_lone_requests_run_inline_and_every_16th_probes_the_thread(backend, records):
    from cloud_api.serving.batcher import INLINE_PROBE_EVERY

    rec = Recording(backend)

    async def main():
        b = make(rec, inline_when_idle=True)
        got = [await b.run([r.payload]) for r in records[:2 * INLINE_PROBE_EVERY]]
        several = await b.run([r.payload for r in records[:3]])  # never inline
        await b.drain()
        return b, np.concatenate(got), several

    b, got, several = run(main())
    loop_thread = threading.current_thread().name
    on_loop = [i for i, (t, _) in enumerate(rec.calls) if t == loop_thread]
    assert b.inline == len(on_loop) == 2 * (INLINE_PROBE_EVERY - 1)
    assert [i for i in range(2 * INLINE_PROBE_EVERY) if i not in on_loop] == [
        INLINE_PROBE_EVERY - 1, 2 * INLINE_PROBE_EVERY - 1]  # the probes took the thread
    assert rec.calls[-1][0] != loop_thread and rec.calls[-1][1] == 3
    want = np.concatenate([backend.forward([r.payload]) for r in records[:2 * INLINE_PROBE_EVERY]])
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(several, backend.forward([r.payload for r in records[:3]]),
                               atol=1e-5)


def test_company_seen_by_a_probe_keeps_requests_on_the_thread(backend, records):
    """A request arriving while a probe's forward runs on the thread raises the recent
    load: the requests after it are batched on the thread, until the load decays."""
    from cloud_api.serving.batcher import INLINE_PROBE_EVERY

    gated = Gated(backend)
    gated.gate.set()

    async def main():
        b = make(gated, inline_when_idle=True)
        for r in records[:INLINE_PROBE_EVERY - 1]:
            await b.run([r.payload])
        inline_before = b.inline
        gated.gate.clear()
        probe = asyncio.create_task(b.run([records[0].payload]))
        await gated.busy()
        company = [asyncio.create_task(b.run([r.payload])) for r in records[1:5]]
        await until(lambda: b.queued == 4, "company queued")
        gated.gate.set()
        await asyncio.gather(probe, *company)
        after = b.inline
        for r in records[5:9]:  # the load (5 at its peak) decays by a fifth a batch
            await b.run([r.payload])
        await b.drain()
        return inline_before, after, b.inline

    inline_before, after, last = run(main())
    assert inline_before == INLINE_PROBE_EVERY - 1 and after == inline_before
    assert last - after < 4  # some of the next lone requests still took the thread


def test_a_failing_inline_forward_is_inference_failed(backend, records):
    from cloud_api.errors import InferenceFailed

    def broken(payloads):
        raise RuntimeError("bad input shape")

    async def main():
        b = make(broken, inline_when_idle=True)
        with pytest.raises(InferenceFailed, match="RuntimeError"):
            await b.run([records[0].payload])
        await b.drain()
        return b.inline

    assert run(main()) == 0


def test_the_forward_overhead_sets_how_finely_lengths_are_split(backend, bundle):
    """A token budget per forward and the backend's fixed cost per forward: with torch's
    (32 padded tokens) the short and middling payloads share one forward; with the int8
    backend's (6) the short ones go without the padding the middling ones would add."""
    from cloud_api.serving.payload_queue import best_groups

    lengths = [6, 6, 7, 7, 12, 13]
    assert best_groups(lengths, 32, 16384, 32.0) == [(0, 6)]
    assert best_groups(lengths, 32, 16384, 6.0) == [(0, 4), (4, 6)]
    gated = Gated(backend)

    async def main():
        b = make(gated, overhead_tokens=6.0)
        first = asyncio.create_task(b.run([payload_of_length(bundle, 10)]))
        await gated.busy()
        tasks = [asyncio.create_task(b.run([payload_of_length(bundle, n - 2)]))
                 for n in lengths]
        await until(lambda: b.queued == len(lengths), "every payload queued")
        gated.gate.set()
        await asyncio.gather(first, *tasks)
        await b.drain()

    run(main())
    assert gated.batches[1:] == [[6, 6, 7, 7], [12, 13]]
