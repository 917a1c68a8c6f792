"""The micro-batcher of one loaded model version.

Requests put their payloads into a bounded queue (:meth:`Batcher.run` queues before its
first ``await``, so nothing can come between the served models choosing a version and
queueing on it). One collector task takes batches off the queue (how a batch is chosen:
:mod:`cloud_api.serving.payload_queue`) and hands each to a free inference replica: a
model copy with its own thread (a replica never runs two forwards at once), off the event
loop:

* the collector waits at most ``max_wait_ms`` for more payloads, and only for as many as
  the recent load (payloads queued or running, its peak decaying batch by batch) gives
  each replica: under steady load it goes as soon as the clients of the last batch are
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
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cloud_api import metrics
from cloud_api.errors import InferenceFailed, Overloaded, TooManyPayloads, Unavailable
from cloud_api.serving.payload_queue import (
    FORWARD_OVERHEAD_TOKENS,
    Disconnected,
    Item,
    PayloadQueue,
    Request,
    payload_length,
)

log = logging.getLogger(__name__)


Forward = Callable[[Sequence], np.ndarray]

INLINE_PROBE_EVERY = 16  # one idle request in this many takes the thread (module docstring)


class Batcher:
    """Micro-batcher over ``forward(payloads) -> (N, C) probabilities`` of one version.

    ``forward`` may be a list: one callable per inference replica (a copy of the model,
    ``PRIVBERT_INFERENCE_WORKERS``), every one in its own thread; a batch goes to whichever
    replica is free, so K replicas run up to K batches at once (on CPU: cores/K threads
    each)."""

    def __init__(self, forward: Forward | Sequence[Forward], *, model_id: str,
                 version: str, max_batch_size: int = 32, max_batch_tokens: int = 16384,
                 max_wait_ms: float = 5.0, max_queue_size: int = 2048,
                 queue_timeout_s: float = 30.0, executor: ThreadPoolExecutor | None = None,
                 inline_when_idle: bool = False,
                 overhead_tokens: float = FORWARD_OVERHEAD_TOKENS):
        self._forwards: list[Forward] = [forward] if callable(forward) else list(forward)
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
        self._queue = PayloadQueue(model_id, version)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._load = 1.0  # payloads in flight (queued + running), peak-held with decay
        self._in_forward = 0  # payloads in batches running now
        self._per_payload_s = 0.01  # running estimate, for Retry-After
        self.batches = 0  # forwards run (tests and logs)
        self.largest_batch = 0
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
        return len(self._queue)

    @property
    def dropped(self) -> int:
        """Requests dropped before inference: client gone."""
        return self._queue.dropped

    async def drain(self) -> None:
        """Refuse new requests, finish everything queued, then stop the collector."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await asyncio.shield(self._closed.wait())
        # whatever never started (no collector) fails rather than hangs
        self._queue.close(Unavailable("the model version was unloaded", retry_after=1))
        if self._own_executor:
            for ex in self._executors:
                ex.shutdown(wait=True)

    # -- requests ---------------------------------------------------------------------------
    def retry_after(self) -> float:
        """Seconds until the queue has likely emptied (at least 1)."""
        return float(max(1, math.ceil(len(self._queue) * self._per_payload_s)))

    def _submit(self, payloads: Sequence, is_disconnected: Disconnected | None) -> Request:
        """Queue ``payloads`` (all or none); Overloaded when the queue has no room for all
        of them."""
        if self._closing:
            raise Unavailable(f"model {self.model_id} {self.version} is being unloaded",
                              retry_after=1)
        n = len(payloads)
        if len(self._queue) + n > self.max_queue_size:
            raise Overloaded(f"the queue of model {self.model_id} is full "
                             f"({len(self._queue)} of {self.max_queue_size} payloads waiting)",
                             retry_after=self.retry_after())
        req = self._queue.add(payloads, is_disconnected)
        if n:
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
                self._queue.withdraw(req)
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
        if not (self.inline_when_idle and len(payloads) == 1 and not self._queue
                and not self._in_forward and not self._closing and self._load < 1.5):
            self._inline_run = 0
            return False
        self._inline_run += 1
        if self._inline_run >= INLINE_PROBE_EVERY:
            self._inline_run = 0
            return False
        return True

    def _run_inline(self, payloads: Sequence) -> np.ndarray:
        """One forward of ``payloads`` on this thread (replica 0; every replica is
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

    def _time_out(self, req: Request) -> None:
        if not req.future.done() and not req.started:
            req.fail(self._timeout_error())
            self._queue.withdraw(req)

    async def _next_batch(self) -> list[Item]:
        """The next batch to run, less the requests whose client went away."""
        return await self._queue.live(self._queue.take_batch(
            self.max_batch_size, self.max_batch_tokens, self.overhead_tokens))

    def _target(self) -> int:
        """Payloads worth waiting for: the recent load (queued + running, its peak decaying
        by a fifth per batch) shared by the replicas. A lone client gets 1: no wait."""
        self._load = max(float(len(self._queue) + self._in_forward), 0.8 * self._load)
        share = math.ceil(self._load / len(self._forwards) - 1e-9)
        return max(1, min(self.max_batch_size, share))

    async def _wait_for_more(self) -> None:
        """Wait (at most max_wait) until the queue holds :meth:`_target` payloads."""
        target = self._target()
        if len(self._queue) >= target or self.max_wait <= 0:
            return
        deadline = time.monotonic() + self.max_wait
        while len(self._queue) < target and not self._closing:
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
                if not self._queue:
                    if self._closing:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                replica = await self._free.get()  # the queue keeps filling meanwhile
                try:
                    await self._wait_for_more()
                    batch = await self._next_batch() if self._queue else []
                except BaseException:
                    self._free.put_nowait(replica)
                    raise
                if not batch:
                    self._free.put_nowait(replica)
                    continue
                for it in batch:
                    it.request.started = True  # too late to time out from here on
                self._in_forward += len(batch)  # now, not when the task starts: _idle_for
                task = asyncio.get_running_loop().create_task(self._run_batch(replica, batch))
                self._running.add(task)
                task.add_done_callback(functools.partial(self._batch_done, replica))
        except asyncio.CancelledError:
            self._queue.fail_all(Unavailable("the server is shutting down", retry_after=1))
            raise
        finally:
            if self._running:
                await asyncio.gather(*list(self._running), return_exceptions=True)
            self._closed.set()

    def _batch_done(self, replica: int, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._free.put_nowait(replica)

    async def _run_batch(self, replica: int, batch: list[Item]) -> None:
        loop = asyncio.get_running_loop()
        try:
            now = time.monotonic()
            for it in batch:
                self._queue_seconds.observe(now - it.request.enqueued)
            payloads = [it.payload for it in batch]
            t0 = time.perf_counter()
            probs = await loop.run_in_executor(self._executors[replica], self._forwards[replica],
                                               payloads)
        except Exception as exc:
            log.exception("inference failed for model %s %s (batch of %d)", self.model_id,
                          self.version, len(batch))
            err = InferenceFailed(f"model {self.model_id} {self.version} failed on a batch "
                                  f"({type(exc).__name__})")
            for req in {id(it.request): it.request for it in batch}.values():
                req.fail(err)
                self._queue.withdraw(req)  # its payloads still queued will never be read
            return
        finally:
            self._in_forward -= len(batch)
        self._finished(batch, time.perf_counter() - t0, max(it.length for it in batch))
        for row, it in zip(probs, batch, strict=True):
            it.request.answer(it.index, row)
