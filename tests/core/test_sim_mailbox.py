"""SimDriver mailboxes count what is due, not what the outside world scheduled."""

from __future__ import annotations

from kernel_actors import Add, AskIt, Counter, Forward

from deepserve.core import MemorySink, SimDriver
from deepserve.core.records import FULL


def test_trace_longer_than_capacity_injected_up_front_drops_nothing():
    # 200 asks scheduled ahead of time against a mailbox of 8: each is due alone,
    # and every answer must reach c/0 (it used to read as full, dropping them).
    sink = MemorySink()
    d = SimDriver(sink=sink, mailbox_capacity=8)
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    for i in range(200):
        d.inject("c/0", AskIt("c/1"), at=1.0 + i * 0.01)
    assert d.pending() == 202
    d.run()
    assert d.mailbox_full == 0
    assert [s for s in sink.steps if s.input.kind == FULL] == []
    assert d.actor("c/1").state.total == 200
    # c/0 added each answer (the running total 1..200) and no ask failed.
    assert d.actor("c/0").state.total == sum(range(1, 201))
    assert d.actor("c/0").state.notes == ()


def test_due_messages_still_fill_a_mailbox():
    # The bound holds for what is due: c/0 forwards to c/1 at the instant 20 other
    # inputs to c/1 (8 slots) fall due, so its message is dropped and recorded.
    sink = MemorySink()
    d = SimDriver(sink=sink, mailbox_capacity=8)
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    d.inject("c/0", Forward("c/1", 100), at=1.0)
    for _ in range(20):
        d.inject("c/1", Add(1), at=1.0)
    d.run()
    assert d.mailbox_full == 1
    assert [s.input.src for s in sink.steps if s.input.kind == FULL] == ["c/0"]
    assert d.actor("c/1").state.total == 20


def test_run_until_stops_before_scheduled_inputs():
    d = SimDriver()
    d.spawn("c/0", Counter)
    d.inject("c/0", Add(1), at=5.0)
    d.run(until=2.0)
    assert d.now == 2.0 and d.pending() == 1 and d.actor("c/0").state.total == 0
    d.run()
    assert d.now == 5.0 and d.actor("c/0").state.total == 1
