"""Every live actor's final state is logged (run end, stop) and verify compares it
with the fold of its events; snapshots are cost-aware."""

from __future__ import annotations

import kernel_actors
from kernel_actors import Add, Appender, Counter, Frequent, Hoard, Sloppy, StopSelf, Tally

from deepserve.core import MemorySink, SimDriver
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.records import SNAPSHOT
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify


def _short_run(cls: type, n: int = 5, stop: bool = False) -> MemorySink:
    sink = MemorySink()
    d = SimDriver(sink=sink)
    d.spawn("a/0", cls)
    for i in range(n):
        d.inject("a/0", Add(i + 1), at=float(i))
    if stop:
        d.inject("a/0", StopSelf(), at=float(n))
    d.run()
    return sink


def _finals(sink: MemorySink) -> list[tuple[str, int]]:
    return [(s.snapshot.actor, s.snapshot.seq) for s in sink.steps if s.input.kind == SNAPSHOT]


def test_run_end_logs_each_live_actor_once_and_verifies():
    sink = _short_run(Counter)
    assert _finals(sink) == [("a/0", 6)]
    assert verify(MemoryLog(sink)).identical


def test_a_change_to_evolve_alone_is_a_divergence(monkeypatch):
    sink = _short_run(Counter)
    monkeypatch.setattr(kernel_actors.Counter, "evolve", lambda self, s, e: Tally(s.total + 2 * e.n))
    result = verify(MemoryLog(sink))
    assert not result.identical
    d = result.divergence
    assert (d.actor, d.seq, d.what) == ("a/0", 6, "final state")
    assert d.expected["state"]["total"] == 15 and d.actual["state"]["total"] == 30


def test_a_handler_mutating_state_in_place_is_a_divergence():
    sink = _short_run(Sloppy)
    result = verify(MemoryLog(sink))
    assert not result.identical and result.divergence.what == "final state"
    assert result.divergence.expected["state"] == [1, 2, 3, 4, 5]
    assert result.divergence.actual["state"] == []


def test_evolve_that_appends_in_place_keeps_the_rule():
    sink = _short_run(Appender, stop=True)
    assert _finals(sink) == [("a/0", 7)]  # at its stop; nothing live at run end
    assert verify(MemoryLog(sink)).identical


def test_stopped_actor_final_state_is_compared(monkeypatch):
    sink = _short_run(Appender, stop=True)

    def doubled(self, state, event):
        return [*state, 2 * event.n]

    monkeypatch.setattr(kernel_actors.Appender, "evolve", doubled)
    assert verify(MemoryLog(sink)).divergence.what == "final state"


async def test_async_driver_logs_live_actors_at_exit():
    sink = MemorySink()
    async with AsyncDriver(sink=sink) as d:
        d.spawn("a/0", Counter)
        d.spawn("a/1", Counter)
        await d.inject("a/0", Add(4))
        await d.idle()
    assert sorted(_finals(sink)) == [("a/0", 2), ("a/1", 1)]
    assert verify(MemoryLog(sink)).identical


def _periodic(sink: MemorySink) -> list:
    return [s.snapshot for s in sink.steps if s.snapshot is not None and s.input.kind != SNAPSHOT]


def test_snapshots_of_a_large_state_are_rare():
    # 5000-entry state (~55 kB) and ~5-byte events: with a fixed count (every 4
    # events) there would be 100 snapshots; cost-aware, none until the events
    # since the last one outweigh the state.
    sink = _short_run(Hoard, n=400)
    final = [s.snapshot for s in sink.steps if s.input.kind == SNAPSHOT]
    state_bytes = len(final[0].payload)
    event_bytes = sum(len(e.payload) for s in sink.steps for e in s.events)
    assert state_bytes > 50_000 and event_bytes < state_bytes
    assert _periodic(sink) == [] and len(final) == 1
    assert verify(MemoryLog(sink)).identical


def test_snapshots_of_a_small_state_follow_the_count():
    sink = _short_run(Frequent, n=20)
    seqs = [s.seq for s in _periodic(sink)]
    assert seqs == [5, 9, 13, 17, 21]  # every 4 events (Started is #1)
    assert verify(MemoryLog(sink)).identical
