"""The payloads of one loaded model version waiting for a batch, and how a batch is taken
off them (the collector and the inference replicas are :mod:`cloud_api.serving.batcher`).

* A request's payloads enter all at once (:meth:`PayloadQueue.add`) and leave when they are
  taken into a batch or their request is withdrawn (cancelled, timed out, its client gone,
  its batch failed).
* A batch is the group of the oldest waiting payload (no one starves) in the cheapest split
  of the oldest waiting payloads, sorted by length, into batches (a forward's overhead plus
  its padded tokens: :func:`best_groups`), so padding stays small; it holds at most
  ``max_batch_size`` payloads and ``max_batch_tokens`` padded tokens (payloads x the
  longest one).
* Before a batch runs, the payloads of requests whose client went away
  (``is_disconnected``) are dropped (:meth:`PayloadQueue.live`).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cloud_api import metrics
from cloud_api.errors import ServiceError


class ClientGone(ServiceError):
    """The client went away before its payloads ran (nginx's 499; nobody reads it)."""

    status, kind, title = 499, "client-closed-request", "Client closed request"

# sync or async, returns True when the client is gone; an object with a ``watch()`` method
# is told when its request is queued (a request run inline never waits, nothing to watch)
Disconnected = Callable[[], object]

FORWARD_OVERHEAD_TOKENS = 32


@dataclass(eq=False)
class Request:
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

    def answer(self, index: int, row: np.ndarray) -> None:
        """The probabilities of payload ``index``; the future resolves with the last one."""
        if self.future.done():
            return
        if self.probs is None:
            self.probs = np.empty((self.n, row.shape[0]), dtype=np.float32)
        self.probs[index] = row
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.probs)


@dataclass(eq=False)
class Item:
    """One waiting payload: its request, its index there, and its padded length."""

    request: Request
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


def best_groups(lengths: Sequence[int], max_size: int, max_tokens: int,
                overhead: float = FORWARD_OVERHEAD_TOKENS) -> list[tuple[int, int]]:
    """Split ``lengths`` (sorted ascending) into consecutive groups ``[i, j)`` that minimise
    the total cost, a forward costing ``overhead`` plus its padded tokens (size x longest),
    with at most ``max_size`` per group and ``max_tokens`` padded tokens (a single payload
    always fits). Dynamic programming, O(len x max_size).

    On CPU the padded tokens dominate the cost of a forward, so payloads grouped by length
    cost less per payload than in arrival order; a forward's fixed cost, in padded tokens,
    is each backend's ``overhead_tokens`` (measured with
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


class PayloadQueue:
    """The waiting payloads of one version, in arrival order, and their queue-size gauge."""

    def __init__(self, model_id: str, version: str):
        self.model_id, self.version = model_id, version
        self.items: list[Item] = []  # items[0] is the oldest
        self.dropped = 0  # requests dropped before inference: client gone
        self._gauge = metrics.QUEUE_SIZE.labels(model=model_id, version=version)
        self._gauge.set(0)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, payloads: Sequence, is_disconnected: Disconnected | None) -> Request:
        """Queue every payload of one request (an empty one resolves at once)."""
        watch = getattr(is_disconnected, "watch", None)
        if watch is not None:
            watch()
        n = len(payloads)
        req = Request(n, asyncio.get_running_loop().create_future(), is_disconnected,
                      time.monotonic(), remaining=n)
        if n == 0:
            req.future.set_result(np.zeros((0, 0), dtype=np.float32))
            return req
        for i, p in enumerate(payloads):
            self.items.append(Item(req, i, p, payload_length(p)))
        self._gauge.set(len(self.items))
        return req

    def withdraw(self, req: Request) -> None:
        """Take ``req``'s waiting payloads out of the queue and cancel its future."""
        before = len(self.items)
        self.items = [it for it in self.items if it.request is not req]
        if len(self.items) != before:
            self._gauge.set(len(self.items))
        if not req.future.done():
            req.future.cancel()

    def take_batch(self, max_size: int, max_tokens: int, overhead: float) -> list[Item]:
        """The oldest payload's group in the cheapest split of the oldest waiting payloads
        into batches of similar length (:func:`best_groups`)."""
        items = self.items
        window = min(len(items), 2 * max_size)
        order = sorted(range(window), key=lambda i: items[i].length)
        groups = best_groups([items[i].length for i in order], max_size, max_tokens, overhead)
        pos = order.index(0)
        i, j = next((i, j) for i, j in groups if i <= pos < j)
        chosen = order[i:j]
        taken = set(chosen)
        batch = [items[i] for i in sorted(chosen)]
        self.items = [it for i, it in enumerate(items) if i not in taken]
        self._gauge.set(len(self.items))
        return batch

    async def live(self, batch: list[Item]) -> list[Item]:
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
                self.withdraw(req)
                self.dropped += 1
        return [it for it in batch if not gone[id(it.request)] and not it.request.future.done()]

    def fail_all(self, exc: BaseException) -> None:
        """Fail every waiting request with ``exc`` (the queue keeps its items)."""
        for it in self.items:
            it.request.fail(exc)

    def close(self, exc: BaseException) -> None:
        """Fail and forget whatever still waits, and drop the gauge's series."""
        self.fail_all(exc)
        self.items.clear()
        self._gauge.set(0)
        metrics.drop_series(metrics.QUEUE_SIZE, self.model_id, self.version)
