"""Run one stage of a stream in a worker thread, a bounded number of items ahead.

``edge-agent privatize`` reads and tokenizes batch i+2 and privatizes batch i+1
while the main thread serialises, posts and writes batch i. The heavy parts of the stages
(tokenizers' Rust code, numpy's random samplers and linear algebra, SIMD base64,
file writes) release the GIL, so on two cores the stages overlap.

Order is kept, results are produced by one worker (a seeded generator is consumed
in the same order as without the thread), and an exception raised by the stage
or by the source iterator comes out of :func:`ahead` at its position, after every
result before it. Stages chain: ``ahead(ahead(batches, tokenize), privatize)`` runs
three threads, and closing the outer one closes the inner one.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")

_DONE = object()


def ahead(source: Iterable[T], stage: Callable[[T], U], depth: int = 1,
          join_timeout: float = 0.5) -> Iterator[U]:
    """``stage(x)`` for each ``x`` of ``source``, computed in one worker thread at most
    ``depth`` results ahead of the consumer.

    Closing the returned generator early (``break``, an exception in the consumer)
    stops the worker after the item it is working on; nothing further is computed.
    The close does not wait more than ``join_timeout`` seconds for that: a worker
    blocked reading a live pipe (stdin that stays open) is left behind as a daemon
    thread, which ends with the process, rather than hanging the caller.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    results: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                results.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    items = iter(source)

    def work() -> None:
        try:
            for x in items:
                if stop.is_set() or not put((True, stage(x))):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put((False, exc))
            return
        finally:  # a source that is itself an `ahead` (or any generator) stops here too
            close = getattr(items, "close", None)
            if close is not None:
                close()
        put((True, _DONE))

    worker = threading.Thread(target=work, name="privbert-ahead", daemon=True)
    worker.start()
    try:
        while True:
            ok, value = results.get()
            if not ok:
                raise value
            if value is _DONE:
                return
            yield value
    finally:
        stop.set()
        worker.join(join_timeout)
