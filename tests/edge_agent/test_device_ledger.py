"""edge_agent.budget.ledger under concurrency: processes charging one ledger at once."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from edge_agent.budget.ledger import DeviceLedger
from edge_agent.errors import BudgetRefused
from shared import ledger

COST = ledger.cost("laplace", {"epsilon": 1.5}, dim=8)  # worst-case epsilon 1.5


def _racer(path: str, barrier, tries: int, results) -> None:
    led = DeviceLedger(Path(path))
    barrier.wait()
    ok = 0
    for _ in range(tries):
        try:
            led.charge([COST], [b"{}"], [None], mechanism="laplace", params={"epsilon": 1.5},
                       bundle_id="0" * 64)
            ok += 1
        except BudgetRefused:
            pass
    led.close()
    results.put(ok)


@pytest.mark.parametrize("cap", [10.0, 14.9])
def test_processes_racing_to_the_cap_never_pass_it(tmp_path, cap):
    """Four processes released together, each charging 10 times 1.5 against one ledger:
    exactly floor(cap / 1.5) charges get through, the rest are refused."""
    path = tmp_path / "ledger.sqlite3"
    with DeviceLedger(path) as led:
        led.set_cap("cap", cap)
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(path), barrier, 10, results))
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    done = sum(results.get(timeout=5) for _ in procs)
    with DeviceLedger(path) as led:
        st = led.status()
    assert done == int(cap // 1.5) == st.spend.sends
    assert st.spent == pytest.approx(done * 1.5, rel=1e-12) and st.spent <= cap


def test_a_refused_batch_stores_nothing(tmp_path):
    with DeviceLedger(tmp_path / "l.sqlite3") as led:
        led.set_cap("cap", 2.0)
        keys = [b"k" * 32, b"j" * 32]
        with pytest.raises(BudgetRefused, match="spent 0, this batch needs 3, cap 2"):
            led.charge([COST, COST], [b"1", b"2"], keys, mechanism="laplace", params={},
                       bundle_id="0" * 64)
        assert led.lookup(keys) == {} and led.status().spend.sends == 0
        got = led.charge([COST], [b"1"], keys[:1], mechanism="laplace", params={},
                         bundle_id="0" * 64)
        assert got.cost.epsilon == 1.5 and led.lookup(keys) == {keys[0]: b"1"}
        again = led.charge([COST, COST], [b"x", b"y"], [keys[0], keys[0]],
                           mechanism="laplace", params={}, bundle_id="0" * 64)
        assert again.payloads == [b"1", b"1"] and again.cost is None and again.memoized == 2
