"""SimDriver runs invariant checkers after every delivery (TigerBeetle-style)."""

from __future__ import annotations

import pytest
from kernel_actors import Add, Counter, Forward

from deepserve.core import SimDriver


def test_invariant_checker_runs_after_every_delivery_and_stops_the_run():
    d = SimDriver()
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    seen = []

    def total_below_ten(driver: SimDriver) -> None:
        seen.append(driver.now)
        total = sum(driver.actor(a).state.total for a in ("c/0", "c/1") if driver.alive(a)
                    and driver.cells[a].actor is not None)
        assert total < 10, f"total reached {total} at t={driver.now}"

    d.invariants.append(total_below_ten)
    for i in range(5):
        d.inject("c/0", Forward("c/1", 3), at=float(i))
    d.inject("c/0", Add(0), at=10.0)
    with pytest.raises(AssertionError, match="total reached 12 at t=3.0"):
        d.run()
    assert len(seen) == 2 + 3 * 2 + 2  # starts, three forwards (2 deliveries each), 4th pair


def test_a_checker_sees_the_cell_it_follows_and_can_end_the_run_call():
    """`step_cell` is the actor just stepped (a checker looks at it alone); `halt` ends the
    current `run` after this delivery, and the next `run` goes on from the next one."""
    d = SimDriver()
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    stepped: list[str] = []

    def follow(driver: SimDriver) -> None:
        stepped.append(driver.step_cell.addr)
        if len(stepped) == 4:
            driver.halt = True

    d.invariants.append(follow)
    for i in range(3):
        d.inject("c/0", Forward("c/1", 3), at=float(i))
    assert d.run() == 4 and d.now == 0.0 and d.pending() == 2  # the starts, the first forward (at 0)
    assert stepped == ["c/0", "c/1", "c/0", "c/1"]
    assert d.run() == 4 and d.actor("c/1").state.total == 9
    assert stepped[4:] == ["c/0", "c/1", "c/0", "c/1"]
