"""SimDriver's queue: deliveries leave in (time, seq) order, and dropping cancelled timers'
entries (`SimDriver._compact`) changes nothing but what is kept."""

from __future__ import annotations

import pytest
from kernel_actors import Add, AskIt, CancelTimer, Counter, SetTimer

from deepserve.core import MemorySink, SimDriver
from deepserve.core import sim as sim_module
from deepserve.core.records import Step

SLACK = sim_module.STALE_SLACK


def _asks(slack: int, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Step], int]:
    """2,000 answered asks (each leaves its cancelled timeout queued) among timers set,
    replaced and cancelled at shared times; the log, and what was pending half way."""
    monkeypatch.setattr(sim_module, "STALE_SLACK", slack)
    sink = MemorySink()
    d = SimDriver(sink=sink)
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    for i in range(2000):
        at = 1.0 + (i // 4) * 0.004  # four inputs a time
        d.inject("c/0", AskIt("c/1", timeout_s=5.0), at=at)
        if i % 7 == 0:
            d.inject("c/1", SetTimer(f"k{i % 3}", 0.004 * (i % 5), i), at=at)
        if i % 11 == 0:
            d.inject("c/1", CancelTimer(f"k{i % 3}"), at=at)
    d.run(until=3.0)
    pending = d.pending()
    d.run()
    return sink.steps, pending


def test_dropping_cancelled_timers_keeps_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    kept, kept_pending = _asks(10**9, monkeypatch)  # never compacts
    dropped, dropped_pending = _asks(SLACK, monkeypatch)
    assert dropped == kept
    assert dropped_pending < kept_pending - 1000  # the answered asks' timeouts are gone


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
