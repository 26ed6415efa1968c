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
