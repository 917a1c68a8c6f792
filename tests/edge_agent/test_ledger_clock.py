"""The device ledger's clock (edge_agent.budget.clock): the per-day window reads the latest
time seen plus what a monotonic clock says has passed; the wall clock is trusted forward
only in an epoch (a boot, a process) the ledger has not seen. The rule on its own, and a
real ledger with the process clock (the clock where there is no boot id)."""

from __future__ import annotations

import time

import pytest

from edge_agent.budget.clock import Anchor, ProcessClock, Reading, ledger_time
from edge_agent.budget.ledger import DeviceLedger
from edge_agent.errors import BudgetRefused
from shared.ledger import Cost

DAY = 86_400.0
T0 = 1.7e9


def test_a_known_epoch_ignores_the_wall_clock():
    anchors = {"boot-a": Anchor(T0, 100.0)}
    for wall in (T0 - 5 * DAY, T0, T0 + 5 * DAY):
        assert ledger_time(T0, anchors, Reading("boot-a", 160.0, True), wall) == T0 + 60.0
    # never before the latest time seen (another epoch may have moved it on)
    assert ledger_time(T0 + DAY, anchors, Reading("boot-a", 160.0, True), T0) == T0 + DAY
    # a reading before the anchor (a clock that went back) counts nothing, never less
    assert ledger_time(T0, anchors, Reading("boot-a", 50.0, True), T0 + DAY) == T0


def test_a_new_epoch_takes_the_later_of_the_wall_clock_and_what_surely_passed():
    anchors = {"boot-a": Anchor(T0, 100.0)}
    # after a reboot: at least the time since boot has passed since the last charge
    assert ledger_time(T0, anchors, Reading("boot-b", 3_600.0, True), T0 - DAY) == T0 + 3_600.0
    assert ledger_time(T0, anchors, Reading("boot-b", 3_600.0, True), T0 + DAY) == T0 + DAY
    # a process clock does not count from a boot: nothing surely passed
    assert ledger_time(T0, anchors, Reading("process:x", 9e5, False), T0 - DAY) == T0
    # no anchor at all (a ledger written before them): no credit for the time since boot
    assert ledger_time(T0, {}, Reading("boot-b", 3_600.0, True), T0 - DAY) == T0
    assert ledger_time(None, {}, Reading("boot-b", 3_600.0, True), T0 - DAY) == T0 - DAY


def charge(led: DeviceLedger, eps: float) -> bool:
    try:
        led.charge([Cost("dchi", eps, metric=1.0, tokens=1)], [b"{}"], [None],
                   mechanism="dchi-text", params={"eta": 1.0}, bundle_id="b" * 64)
        return True
    except BudgetRefused:
        return False


def test_two_processes_without_a_boot_clock_each_trust_the_wall_clock_once(tmp_path):
    """Where there is no boot id each process is an epoch: its first charge takes the wall
    clock forward (the documented residual), and after that two processes charging in turn
    keep their own anchors, so a wall clock stepped a day before every charge buys nothing
    more."""
    time_machine = pytest.importorskip("time_machine")
    path = tmp_path / "ledger.sqlite3"
    a = DeviceLedger(path, clock=ProcessClock())
    b = DeviceLedger(path, clock=ProcessClock())
    a.set_cap("per_day", 10.0)
    passed = []
    with time_machine.travel(time.time(), tick=True) as traveller:
        for n in range(12):
            traveller.shift(DAY + 60)
            passed.append(charge(a if n % 2 == 0 else b, 4.0))
    a.close()
    b.close()
    # a's first charge and b's first each open a window at the wall clock; a's second is
    # timed at b's (the latest time seen), where only b's 4 are in the window: 8 <= 10;
    # after that both run on their anchors, and the wall clock buys nothing
    assert passed == [True, True, True] + [False] * 9, passed
