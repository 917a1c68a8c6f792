"""The micro-batcher of one loaded model version.

Requests put their payloads into a bounded queue (:meth:`Batcher.run` queues before its
first ``await``, so nothing can come between the registry choosing a version and queueing
on it). One
collector task takes batches off the queue and hands each to a free inference worker: a
model replica with its own thread (a replica never runs two forwards at once), off the
event loop:

* a batch holds at most ``max_batch_size`` payloads and ``max_batch_tokens`` padded tokens
  (payloads x the longest one);
* it is the group of the oldest waiting payload (no one starves) in the cheapest split of
  the oldest waiting payloads, sorted by length, into batches (a forward's overhead plus
  its padded tokens: :func:`best_groups`), so padding stays small;
* the collector waits at most ``max_wait_ms`` for more payloads, and only for as many as
  the recent load (payloads queued or running, its peak decaying batch by batch) gives
  each worker: under steady load it goes as soon as the clients of the last batch are
  back, a lone client never waits;
* a payload whose request was cancelled or whose client went away (``is_disconnected``) is
  dropped before inference; a request that waited longer than ``queue_timeout_s`` fails
  with :class:`~cloud_api.errors.Unavailable` (503, ``Retry-After``).

A full queue refuses a request with :class:`~cloud_api.errors.Overloaded` (429), one with
more payloads than the queue holds with :class:`~cloud_api.errors.TooManyPayloads` (413:
it could never be queued, retrying does not help); both at once, in :meth:`Batcher.admit`,
which a caller runs before it charges anything for the request. A request
of several payloads resolves when all of them are done, in input order. :meth:`drain`
finishes everything queued, then stops the collector and the thread.

Idle (``inline_when_idle``): a one-payload request that finds nothing queued, nothing
running and no recent load runs its forward at once on the event loop's thread, as a
serial server would: the hand-off to an inference thread and back cost a lone client more
than all of the service's checks (``bench/serve.py`` measures both). The loop is
blocked for that one forward, so a client arriving meanwhile is read when it ends; to see
such company, every :data:`INLINE_PROBE_EVERY`-th idle request goes through the queue and
the thread all the same (the loop stays free during its forward): a request arriving then
raises the recent load, and the batcher stays on the thread until the load has decayed.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from cloud_api import metrics
from cloud_api.errors import (
    InferenceFailed,
    Overloaded,
    ServiceError,
    TooManyPayloads,
    Unavailable,
)

log = logging.getLogger(__name__)


class ClientGone(ServiceError):
    """The client went away before its payloads ran (nginx's 499; nobody reads it)."""

    status, kind, title = 499, "client-closed-request", "Client closed request"

Disconnected = Callable[[], object]  # sync or async, returns True when the client is gone


@dataclass(eq=False)
class _Request:
    """One predict call: its payloads' results land in ``probs`` at their input index."""

    n: int
    future: asyncio.Future
    is_disconnected: Disconnected | None
    enqueued: float
    probs: np.ndarray | None = None
    remaining: int = 0
    started: bool = False  # some payload is in a batch (too late to time out)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


@dataclass(eq=False)
class _Item:
    request: _Request
    index: int
    payload: object
    length: int


def payload_length(payload) -> int:
    """Padded length of a payload in the model: tokens + [CLS]/[SEP]; vectors count 1."""
    n = getattr(payload, "n_tokens", None)
    if n is None:
        return 1
    segs = getattr(payload, "segments", None)
    return int(n) + (3 if segs is not None and len(segs) == 2 else 2)


Forward = Callable[[Sequence], np.ndarray]


FORWARD_OVERHEAD_TOKENS = 32
INLINE_PROBE_EVERY = 16  # one idle request in this many takes the thread (module docstring)


def best_groups(lengths: Sequence[int], max_size: int, max_tokens: int,
                overhead: float = FORWARD_OVERHEAD_TOKENS) -> list[tuple[int, int]]:
    """Split ``lengths`` (sorted ascending) into consecutive groups ``[i, j)`` that minimise
    the total cost, a forward costing ``overhead`` plus its padded tokens (size x longest),
    with at most ``max_size`` per group and ``max_tokens`` padded tokens (a single payload
    always fits). Dynamic programming, O(len x max_size).

    On CPU the padded tokens dominate the cost of a forward, so SST-2 payloads grouped by
    length cost about half as much per payload as in arrival order; a forward's fixed cost,
    in padded tokens, is each backend's ``overhead_tokens`` (measured with
    ``python -m bench.serve --padding --threads 1``). So a long payload waits for its own
    batch rather than pad many short ones, and short ones still share a forward."""
    k = len(lengths)
    best = [0.0] + [math.inf] * k
    cut = [0] * (k + 1)
    for j in range(1, k + 1):
        longest = lengths[j - 1]
        for i in range(j - 1, max(-1, j - 1 - max_size), -1):
            n = j - i
            if n > 1 and n * longest > max_tokens:
                break
            cost = best[i] + overhead + n * longest
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], k
    while j > 0:
        groups.append((cut[j], j))
        j = cut[j]
    return groups[::-1]


class Batcher:
    """Micro-batcher over ``forward(payloads) -> (N, C) probabilities`` of one version.

    ``forward`` may be a list: one callable per inference worker (a model replica each),
    every one in its own thread; a batch goes to whichever worker is free, so K workers
    run up to K batches at once (on CPU: K replicas with cores/K threads each)."""

    def __init__(self, forward: Forward | Sequence[Forward], *, model_id: str,
                 version: str, max_batch_size: int = 32, max_batch_tokens: int = 16384,
                 max_wait_ms: float = 5.0, max_queue_size: int = 2048,
                 queue_timeout_s: float = 30.0, executor: ThreadPoolExecutor | None = None,
                 inline_when_idle: bool = False,
                 overhead_tokens: float = FORWARD_OVERHEAD_TOKENS):
        self._forwards: list[Forward] = list(forward) if isinstance(forward, list | tuple) \
            else [forward]
        self.model_id, self.version = model_id, version
        self.max_batch_size = max(1, int(max_batch_size))
        self.max_batch_tokens = max(1, int(max_batch_tokens))
        self.max_wait = max(0.0, float(max_wait_ms)) / 1000.0
        self.max_queue_size = max(1, int(max_queue_size))
        self.queue_timeout = float(queue_timeout_s)
        self.inline_when_idle = inline_when_idle
        self.overhead_tokens = float(overhead_tokens)  # a forward's fixed cost (best_groups)
        self._inline_run = 0  # idle requests run inline in a row (the probe's counter)
        self.inline = 0  # forwards run inline (tests and logs)
        self._own_executor = executor is None
        self._executors = [executor or ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"infer-{model_id}-{version}-{w}")
            for w in range(len(self._forwards))]
        self._free: asyncio.Queue[int] = asyncio.Queue()
        for w in range(len(self._forwards)):
            self._free.put_nowait(w)
        self._running: set[asyncio.Task] = set()
        self._items: list[_Item] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._load = 1.0  # payloads in flight (queued + running), peak-held with decay
        self._in_forward = 0  # payloads in batches running now
        self._per_payload_s = 0.01  # running estimate, for Retry-After
        self.batches = 0  # forwards run (tests and logs)
        self.dropped = 0  # requests dropped before inference: client gone
        self.largest_batch = 0
        self._queue_gauge = metrics.QUEUE_SIZE.labels(model=model_id, version=version)
        self._queue_gauge.set(0)
        # bound once: a labels() lookup (a lock and a dict) per payload adds up on the hot path
        self._queue_seconds = metrics.QUEUE_DURATION.labels(model=model_id)
        self._forward_seconds = metrics.INFERENCE_DURATION.labels(model=model_id)
        self._batch_size = metrics.BATCH_SIZE.labels(model=model_id)
        self._batch_tokens = metrics.BATCH_TOKENS.labels(model=model_id)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Batcher:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._collect(), name=f"batcher-{self.model_id}-{self.version}")
        return self

    @property
    def queued(self) -> int:
        """Payloads waiting (not yet in a batch)."""
        return len(self._items)

    async def drain(self) -> None:
        """Refuse new requests, finish everything queued, then stop the collector."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await asyncio.shield(self._closed.wait())
        for it in self._items:  # never started (no collector): fail rather than hang
            it.request.fail(Unavailable("the model version was unloaded", retry_after=1))
        self._items.clear()
        self._queue_gauge.set(0)
        if self._own_executor:
            for ex in self._executors:
                ex.shutdown(wait=True)
        metrics.drop_series(metrics.QUEUE_SIZE, self.model_id, self.version)

    # -- requests ---------------------------------------------------------------------------
    def retry_after(self) -> float:
        """Seconds until the queue has likely emptied (at least 1)."""
        return float(max(1, math.ceil(len(self._items) * self._per_payload_s)))

    def _submit(self, payloads: Sequence, is_disconnected: Disconnected | None) -> _Request:
        """Queue ``payloads`` (all or none); Overloaded when the queue has no room for all
        of them."""
        if self._closing:
            raise Unavailable(f"model {self.model_id} {self.version} is being unloaded",
                              retry_after=1)
        n = len(payloads)
        if len(self._items) + n > self.max_queue_size:
            raise Overloaded(f"the queue of model {self.model_id} is full "
                             f"({len(self._items)} of {self.max_queue_size} payloads waiting)",
                             retry_after=self.retry_after())
        loop = asyncio.get_running_loop()
        req = _Request(n, loop.create_future(), is_disconnected, time.monotonic(), remaining=n)
        if n == 0:
            req.future.set_result(np.zeros((0, 0), dtype=np.float32))
            return req
        for i, p in enumerate(payloads):
            self._items.append(_Item(req, i, p, payload_length(p)))
        self._queue_gauge.set(len(self._items))
        self._wakeup.set()
        return req

    async def run(self, payloads: Sequence, is_disconnected: Disconnected | None = None
                  ) -> np.ndarray:
        """Queue ``payloads`` and wait for their probabilities (N, C), in input order
        (:meth:`admit`, then its waiter)."""
        return await self.admit(payloads, is_disconnected)()

    def admit(self, payloads: Sequence, is_disconnected: Disconnected | None = None
              ) -> Callable[[], Awaitable[np.ndarray]]:
        """Admit ``payloads`` now, without awaiting: TooManyPayloads (413) when the queue can
        never hold them, Overloaded (429) when it is full now, Unavailable while unloading;
        else they are queued (or, idle, will run inline) and the returned coroutine function
        waits for their probabilities (N, C), in input order. A request still queued after
        ``queue_timeout_s`` fails with Unavailable (its timer, the only place a queue
        timeout happens); one already in a batch gets its answer. Cancelling the waiter
        cancels the request's future at once, so a batch formed afterwards leaves it out.
        Call the waiter before anything else awaits (an inline forward counts on the idle
        state seen here)."""
        if len(payloads) > self.max_queue_size:
            raise TooManyPayloads(f"{len(payloads)} payloads in one request; model "
                                  f"{self.model_id} queues at most {self.max_queue_size} "
                                  "(PRIVBERT_MAX_QUEUE_SIZE): send at most that many per "
                                  "request")
        if self._idle_for(payloads):
            async def inline() -> np.ndarray:
                return self._run_inline(payloads)
            return inline
        req = self._submit(payloads, is_disconnected)
        timer = asyncio.get_running_loop().call_later(self.queue_timeout, self._time_out, req)

        async def wait() -> np.ndarray:
            try:
                return await req.future
            except asyncio.CancelledError:
                self._withdraw(req)
                raise
            finally:
                timer.cancel()
        return wait

    # -- internals --------------------------------------------------------------------------
    def _idle_for(self, payloads: Sequence) -> bool:
        """Whether ``payloads`` run inline (module docstring): one payload, nothing queued or
        running (``_in_forward`` counts a batch from its dispatch until its forward has
        returned, so no replica is in use), the recent load about one, and not the
        probe's turn."""
        if not (self.inline_when_idle and len(payloads) == 1 and not self._items
                and not self._in_forward and not self._closing and self._load < 1.5):
            self._inline_run = 0
            return False
        self._inline_run += 1
        if self._inline_run >= INLINE_PROBE_EVERY:
            self._inline_run = 0
            return False
        return True

    def _run_inline(self, payloads: Sequence) -> np.ndarray:
        """One forward of ``payloads`` on this thread (worker 0's replica; every worker is
        free and the loop runs nothing else meanwhile)."""
        self._load = max(1.0, 0.8 * self._load)
        self._queue_seconds.observe(0.0)
        t0 = time.perf_counter()
        try:
            probs = self._forwards[0](payloads)
        except Exception as exc:
            log.exception("inference failed for model %s %s (batch of %d)", self.model_id,
                          self.version, len(payloads))
            raise InferenceFailed(f"model {self.model_id} {self.version} failed on a batch "
                                  f"({type(exc).__name__})") from None
        self._finished(payloads, time.perf_counter() - t0,
                       max(payload_length(p) for p in payloads))
        self.inline += 1
        return np.asarray(probs, dtype=np.float32)

    def _finished(self, batch: Sequence, took: float, longest: int) -> None:
        """Counters and metrics of one forward of ``batch`` that took ``took`` seconds."""
        self._per_payload_s = 0.8 * self._per_payload_s + 0.2 * took / len(batch)
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        self._forward_seconds.observe(took)
        self._batch_size.observe(len(batch))
        self._batch_tokens.observe(len(batch) * longest)

    def _timeout_error(self) -> Unavailable:
        return Unavailable(f"model {self.model_id} is busy: the request waited "
                           f"{self.queue_timeout:g} s in the queue",
                           retry_after=self.retry_after())

    def _time_out(self, req: _Request) -> None:
        if not req.future.done() and not req.started:
            req.fail(self._timeout_error())
            self._withdraw(req)

    def _withdraw(self, req: _Request) -> None:
        """Take ``req``'s waiting payloads out of the queue and cancel its future."""
        before = len(self._items)
        self._items = [it for it in self._items if it.request is not req]
        if len(self._items) != before:
            self._queue_gauge.set(len(self._items))
        if not req.future.done():
            req.future.cancel()

    async def _live(self, batch: list[_Item]) -> list[_Item]:
        """``batch`` without the payloads of requests whose client went away (their
        futures are cancelled: nobody reads the answer)."""
        gone: dict[int, bool] = {}
        for it in batch:
            req = it.request
            if id(req) in gone:
                continue
            dead = req.future.done()
            if not dead and req.is_disconnected is not None:
                try:
                    res = req.is_disconnected()
                    if inspect.isawaitable(res):
                        res = await res
                    dead = bool(res)
                except Exception:  # a broken check must not stop the batcher
                    dead = False
            gone[id(req)] = dead
            if dead:
                req.fail(ClientGone("the client went away before inference"))
                self._withdraw(req)
                self.dropped += 1
        return [it for it in batch if not gone[id(it.request)] and not it.request.future.done()]

    def _take_batch(self) -> list[_Item]:
        """The oldest payload's group in the cheapest split of the oldest waiting payloads
        into batches of similar length (:func:`best_groups`)."""
        items = self._items  # in arrival order: items[0] is the oldest
        window = min(len(items), 2 * self.max_batch_size)
        order = sorted(range(window), key=lambda i: items[i].length)
        groups = best_groups([items[i].length for i in order], self.max_batch_size,
                             self.max_batch_tokens, self.overhead_tokens)
        pos = order.index(0)
        i, j = next((i, j) for i, j in groups if i <= pos < j)
        chosen = order[i:j]
        taken = set(chosen)
        batch = [items[i] for i in sorted(chosen)]
        self._items = [it for i, it in enumerate(items) if i not in taken]
        self._queue_gauge.set(len(self._items))
        return batch

    def _target(self) -> int:
        """Payloads worth waiting for: the recent load (queued + running, its peak decaying
        by a fifth per batch) shared by the workers. A lone client gets 1: no wait."""
        self._load = max(float(len(self._items) + self._in_forward), 0.8 * self._load)
        share = math.ceil(self._load / len(self._forwards) - 1e-9)
        return max(1, min(self.max_batch_size, share))

    async def _wait_for_more(self) -> None:
        """Wait (at most max_wait) until the queue holds :meth:`_target` payloads."""
        target = self._target()
        if len(self._items) >= target or self.max_wait <= 0:
            return
        deadline = time.monotonic() + self.max_wait
        while len(self._items) < target and not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except TimeoutError:
                return

    async def _collect(self) -> None:
        try:
            while True:
                if not self._items:
                    if self._closing:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                worker = await self._free.get()  # the queue keeps filling meanwhile
                try:
                    await self._wait_for_more()
                    batch = await self._live(self._take_batch()) if self._items else []
                except BaseException:
                    self._free.put_nowait(worker)
                    raise
                if not batch:
                    self._free.put_nowait(worker)
                    continue
                for it in batch:
                    it.request.started = True  # too late to time out from here on
                self._in_forward += len(batch)  # now, not when the task starts: _idle_for
                task = asyncio.get_running_loop().create_task(self._run_batch(worker, batch))
                self._running.add(task)
                task.add_done_callback(functools.partial(self._batch_done, worker))
        except asyncio.CancelledError:
            for it in self._items:
                it.request.fail(Unavailable("the server is shutting down", retry_after=1))
            raise
        finally:
            if self._running:
                await asyncio.gather(*list(self._running), return_exceptions=True)
            self._closed.set()

    def _batch_done(self, worker: int, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._free.put_nowait(worker)

    async def _run_batch(self, worker: int, batch: list[_Item]) -> None:
        loop = asyncio.get_running_loop()
        try:
            now = time.monotonic()
            for it in batch:
                self._queue_seconds.observe(now - it.request.enqueued)
            payloads = [it.payload for it in batch]
            t0 = time.perf_counter()
            probs = await loop.run_in_executor(self._executors[worker], self._forwards[worker],
                                               payloads)
        except Exception as exc:
            log.exception("inference failed for model %s %s (batch of %d)", self.model_id,
                          self.version, len(batch))
            err = InferenceFailed(f"model {self.model_id} {self.version} failed on a batch "
                                  f"({type(exc).__name__})")
            for req in {id(it.request): it.request for it in batch}.values():
                req.fail(err)
                self._withdraw(req)  # its payloads still queued will never be read
            return
        finally:
            self._in_forward -= len(batch)
        self._finished(batch, time.perf_counter() - t0, max(it.length for it in batch))
        for row, it in zip(probs, batch, strict=True):
            req = it.request
            if req.future.done():
                continue
            if req.probs is None:
                req.probs = np.empty((req.n, row.shape[0]), dtype=np.float32)
            req.probs[it.index] = row
            req.remaining -= 1
            if req.remaining == 0:
                req.future.set_result(req.probs)
