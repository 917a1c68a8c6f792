"""Charges of prediction requests, committed in groups (group commit).

A prediction stores nothing, so its charge is a transaction of its own; a durable commit
costs a disk flush (milliseconds with SQLite's ``synchronous = FULL``), and SQLite's
busy handler makes concurrent writers sleep in steps of milliseconds. So one thread takes
every charge waiting at the time and applies them in one transaction, each with its own
check (``budgets.charge``: a refused one changes nothing and gets its BudgetExhausted), and
commits once: the requests of a group share one flush. A request is answered only after
its group is committed (durable before its answer is sent; the route runs the model
meanwhile, see ``cloud_api.routes.inference``).

    writer = ChargeWriter(db)
    charged = await writer.charge(Charge(key_id, device_id, cost, default_cap))
    writer.refund(charge, "client-gone")   # a committed charge whose request got no answer
    writer.close()

A refund (``budgets.refund``) goes through the same thread, after the charge it takes back
was committed; nobody waits for it (a failure is logged: the ledger then over-counts).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from cloud_api.errors import ServiceError
from cloud_api.store import budgets
from cloud_api.store.db import Database

log = logging.getLogger(__name__)
MAX_GROUP = 512


class ChargeWriter:
    """One thread committing groups of charges to ``db``."""

    def __init__(self, db: Database):
        self.db = db
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._conn: Connection | None = None  # the writer thread's own, see _apply
        self.groups = 0  # committed groups (tests, metrics)

    def submit(self, ch: budgets.Charge) -> asyncio.Future:
        """Queue ``ch`` now (from the event loop's thread); the future is settled once its
        group is committed: the Charged, or BudgetExhausted, or Unavailable when the
        database cannot be written. A caller may do other work before awaiting it."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._start()
        self._queue.put((ch, loop, fut))
        return fut

    def refund(self, ch: budgets.Charge, reason: str) -> None:
        """Queue the refund of ``ch`` (committed before; its request got no answer)."""
        self._start()
        self._queue.put((_Refund(ch, reason), None, None))

    async def charge(self, ch: budgets.Charge) -> budgets.Charged:
        """Charge ``ch``; returns once its group is committed (see :meth:`submit`)."""
        return await self.submit(ch)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="privbert-charges",
                                                daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Finish the charges queued so far, then stop the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(30)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._drop_connection()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            stop = False
            while len(group) < MAX_GROUP:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                group.append(item)
            self._commit(group)
            if stop:
                return

    def _apply(self, group: list) -> list:
        """The group's charges in one transaction on the writer's own connection, kept open
        between groups (a pool checkout with its ping costs a lone request more CPU than
        the UPDATE). Applied in key order (stable: a key's charges keep their order), so two
        writers (``serve --workers N``) lock the rows of their groups in one order and never
        deadlock; results in group order."""
        if self._conn is None:
            self._conn = self.db.write_connection()
        results: list = [None] * len(group)
        order = sorted(range(len(group)), key=lambda i: _key_of(group[i][0]))
        with self._conn.begin():
            for i in order:
                ch = group[i][0]
                if isinstance(ch, _Refund):
                    budgets.refund(self._conn, ch.charge, ch.reason)
                    continue
                try:
                    results[i] = budgets.charge(self._conn, ch)
                except budgets.BudgetExhausted as exc:  # this one changed nothing
                    results[i] = exc
        return results

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is broken already
                pass

    def _commit(self, group: list) -> None:
        try:
            with self.db.outage_as_unavailable():
                try:
                    results = self._apply(group)
                except DBAPIError as exc:
                    if not exc.connection_invalidated:
                        raise
                    # the kept connection died (database restarted): nothing of this
                    # transaction was committed, so once more on a new one
                    self._drop_connection()
                    results = self._apply(group)
            self.groups += 1
        except Exception as exc:  # noqa: BLE001 - every request of the group gets it
            self._drop_connection()
            if not isinstance(exc, ServiceError):
                log.exception("committing %d prediction charges failed", len(group))
            results = [exc] * len(group)
        for (item, loop, fut), res in zip(group, results, strict=True):
            if fut is None:  # a refund: nobody waits
                if isinstance(res, BaseException):
                    log.warning("a refund of %s was not committed (%s): the ledger of key "
                                "%s over-counts", item.reason, type(res).__name__,
                                item.charge.key_id)
                continue
            try:
                loop.call_soon_threadsafe(_settle, fut, res)
            except RuntimeError:  # its event loop is closed: nobody waits any more
                pass


def _key_of(item) -> str:
    return item.charge.key_id if isinstance(item, _Refund) else item.key_id


@dataclass(frozen=True)
class _Refund:
    charge: budgets.Charge
    reason: str


def _settle(fut: asyncio.Future, res) -> None:
    if fut.done():  # the request went away meanwhile
        return
    if isinstance(res, BaseException):
        fut.set_exception(res)
    else:
        fut.set_result(res)
