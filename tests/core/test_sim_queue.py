"""SimDriver's queue: deliveries leave in (time, seq) order."""

from __future__ import annotations

from kernel_actors import Add, Counter, SetTimer

from deepserve.core import MemorySink, SimDriver


def test_equal_times_leave_in_seq_order() -> None:
    # The input at t=1 is injected (its seq drawn) before the timer due at t=1 is set:
    # it is delivered first, though it enters the queue after the timer.
    sink = MemorySink()
    d = SimDriver(sink=sink)
    d.spawn("c/0", Counter)
    d.inject("c/0", Add(5), at=1.0)
    d.inject("c/0", SetTimer("k", 1.0, 7))
    d.inject("c/0", Add(3), at=1.0)
    d.run()
    at_one = [(s.input.type, s.input.src) for s in sink.steps if s.input.t == 1.0 and s.input.seq >= 0]
    assert at_one == [("Add", "ext/input"), ("Add", "ext/input"), ("Add", "c/0")]
    assert [e.type for s in sink.steps if s.input.t == 1.0 for e in s.events] == ["Added"] * 3
    assert d.actor("c/0").state.total == 15
