"""Fixtures of the record store tests: a declared task on the migrated database ``db``
(tests/cloud_api/conftest.py: SQLite and a real PostgreSQL), records privatized by the
edge's own Privatizer on the tiny bundle, and ``race`` (calls at once)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from cloud_api.store import tasks

# eta for the tiny 16-dimensional bundle: above 12.7 dchi-text returns every token unchanged
# (shared.floor refuses it)
ETA = 8  # the tiny table keeps 88% of tokens; at eta 10 (96%) the floor, measured afresh at
# each check, refuses about one check in 400
TEXTS = ["the movie is good", "a bad plot , very dull", "great fun !", "awful story",
         "not boring", "it was a funny film"]


@pytest.fixture
def task(db, tiny_bundle):
    """A dchi-text task (eta ETA) on the tiny bundle."""
    t, created = tasks.ensure_task(db, "sst2", ["neg", "pos"], "dchi-text", {"eta": ETA},
                                   tiny_bundle.bundle_id)
    assert created
    return t


def privatize(bundle, mechanism, n: int, seed: int = 0, texts=TEXTS) -> list:
    """``n`` payloads of ``texts`` (cycled) by the edge's Privatizer."""
    from edge_agent import Privatizer

    rng = np.random.default_rng(seed)
    lines = [texts[i % len(texts)] for i in range(n)]
    return Privatizer(bundle, mechanism).privatize(lines, rng=rng)


def raw_records(payloads, labels=None) -> list[dict]:
    """Records as JSON-ready dicts (what arrives in a request body)."""
    labels = labels if labels is not None else [i % 2 for i in range(len(payloads))]
    return [{"payload": p.model_dump(mode="json", exclude_none=True), "label": lab}
            for p, lab in zip(payloads, labels, strict=True)]


def race(calls: list[Callable[[], object]], timeout: float = 120) -> list:
    """Run ``calls`` at once, one thread each, released together by a barrier; their
    results in order (an exception raised by a call takes its place)."""
    start = threading.Barrier(len(calls))
    out: list = [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - the caller's assertion shows it
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return out
