"""AsyncDriver runs the same actors as SimDriver: same per-actor events for inputs
in a fixed order; asks, dead letters, full mailboxes, timers and the outbox."""

from __future__ import annotations

import threading

import anyio
import pytest
from kernel_actors import Add, AskIt, Boom, Counter, Forward, SetTimer, SpawnChild, StopOther

from deepserve.core import MemorySink, SimDriver
from deepserve.core.asyncdriver import AskError, AsyncDriver
from deepserve.core.records import DEAD, FULL, SNAPSHOT

SCRIPT = [
    ("c/0", Add(1)), ("c/0", Forward("c/1", 2)), ("c/1", Boom()), ("c/1", Add(3)),
    ("c/0", SpawnChild("c/0/k")), ("c/0/k", Add(4)), ("c/0", StopOther("c/0/k")),
    ("c/0", AskIt("c/1", 5.0)), ("c/0", AskIt("none/1", 5.0)),
]


def _per_actor_events(sink: MemorySink) -> dict[str, list[tuple[str, bytes]]]:
    out: dict[str, list[tuple[str, bytes]]] = {}
    for s in sink.steps:
        for e in s.events:
            payload = b"" if e.type == "HandlerFailed" else e.payload  # traceback text
            out.setdefault(s.input.actor, []).append((e.type, payload))
    return out


def _sim_events() -> dict[str, list[tuple[str, bytes]]]:
    sink = MemorySink()
    d = SimDriver(seed=3, sink=sink)
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    for i, (dst, msg) in enumerate(SCRIPT):
        d.inject(dst, msg, at=float(i))  # one at a time: the order is fixed
        d.run()
    return _per_actor_events(sink)


async def test_same_events_as_sim_for_fixed_order_inputs():
    sink = MemorySink()
    async with AsyncDriver(seed=3, sink=sink) as d:
        d.spawn("c/0", Counter)
        d.spawn("c/1", Counter)
        await d.idle()
        for dst, msg in SCRIPT:
            await d.inject(dst, msg)
            await d.idle()
    assert _per_actor_events(sink) == _sim_events()
    assert d.actor("c/0").state.notes == ("askfailed:target is dead",)


async def test_external_ask_reply_dead_target_and_timeout():
    async with AsyncDriver() as d:
        d.spawn("c/0", Counter)
        reply = await d.ask("c/0", Add(5), timeout_s=1.0)
        assert reply == Add(5)
        with pytest.raises(AskError, match="target is dead"):
            await d.ask("nobody/0", Add(1), timeout_s=1.0)
        d.spawn("c/1", Counter)
        await d.inject("c/1", SetTimer("t", 0.05, 1))
        with pytest.raises(AskError, match="timeout after 0.02s"):
            await d.ask("c/1", Forward("c/0", 1), timeout_s=0.02)  # Forward never replies
        await anyio.sleep(0.1)
        assert d.actor("c/1").state.total == 1  # the wall-clock timer fired


async def test_full_mailbox_and_dead_letters_are_recorded():
    sink = MemorySink()
    async with AsyncDriver(sink=sink, mailbox_capacity=4) as d:
        d.spawn("c/0", Counter)
        await d.idle()
        accepted = [d.inject_nowait("c/0", Add(1)) for _ in range(6)]  # no await: no drain
        d.inject_nowait("ghost/0", Add(1))
        await d.idle()
    # External inputs are admitted up to half the mailbox (the edge limit): the rest
    # is kept for messages between actors.
    assert accepted.count(0) == 4 and d.mailbox_full == 4 and d.dead_letters == 1
    assert d.refused == 4
    kinds = [s.input.kind for s in sink.steps if s.input.seq < 0 and s.input.kind != SNAPSHOT]
    assert sorted(kinds) == [DEAD, FULL, FULL, FULL, FULL]
    assert d.actor("c/0").state.total == 2


class CommitLater(MemorySink):
    """A sink whose 'commits' happen on another thread only when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.on_commit = None
        self.lock = threading.Lock()

    def commit_all(self) -> None:
        threading.Thread(target=self.on_commit, args=(len(self.steps),)).start()


async def test_outbox_holds_outputs_until_commit():
    sink = CommitLater()
    async with AsyncDriver(sink=sink, outbox=True) as d:
        d.spawn("c/0", Counter)
        d.spawn("c/1", Counter)
        await anyio.sleep(0.01)
        assert "c/0" in d.cells and d.cells["c/0"].actor is not None
        await d.inject("c/0", Forward("c/1", 9))
        await anyio.sleep(0.02)
        assert d.actor("c/1").state.total == 0  # the forward is held: not committed yet
        sink.commit_all()
        await anyio.sleep(0.02)
        sink.commit_all()  # c/1's step is appended after the first release
        await d.idle()
        assert d.actor("c/1").state.total == 9


async def test_outbox_releases_a_spawn_once_committed():
    """A released step that spawns a child starts it (the release used to run in a bare loop
    callback, where starting the child's task raised and `idle()` then hung: a user tour)."""
    sink = CommitLater()
    async with AsyncDriver(sink=sink, outbox=True) as d:
        d.spawn("c/0", Counter)
        await anyio.sleep(0.01)
        await d.inject("c/0", SpawnChild("c/0/k"))
        await anyio.sleep(0.02)
        assert "c/0/k" not in d.cells  # held: not committed yet
        sink.commit_all()
        await anyio.sleep(0.02)
        sink.commit_all()  # the child's Started step
        with anyio.fail_after(5):
            await d.idle()
        assert d.alive("c/0/k")
        await d.inject("c/0/k", Add(4))
        await anyio.sleep(0.02)
        sink.commit_all()
        with anyio.fail_after(5):
            await d.idle()
        assert d.actor("c/0/k").state.total == 4


async def test_root_escalation_is_kept_by_the_driver():
    from kernel_actors import Child

    async with AsyncDriver() as d:
        d.spawn("root/0", Child)  # escalates, and has no parent to tell
        await d.inject("root/0", Boom())
        await d.idle()
    assert d.escalations == [("root/0", "escalate: RuntimeError: boom")]
    assert not d.alive("root/0")


async def test_answered_asks_cost_the_timer_task_no_wake_each():
    # 300 asks answered at once leave 300 cancelled timeouts behind; the timer task drops them
    # together instead of waking once for each at its deadline (a daemon asks all day long),
    # and a new ask does not wake it either: woken by the first ask, at 0.05 s, at 0.15 s
    async with AsyncDriver() as d:
        d.spawn("c/0", Counter)
        d.spawn("c/1", Counter)
        for _ in range(300):
            await d.inject("c/0", AskIt("c/1", 0.05))
        await d.inject("c/1", SetTimer("late", 0.15, 1))
        await anyio.sleep(0.3)
        # every ask answered (c/1 answers each with its running total), none timed out
        assert d.actor("c/0").state.total == sum(range(1, 301)) and not d.actor("c/0").state.notes
        assert d.actor("c/1").state.total == 300 + 1  # the live timer fired
        assert d.timer_wakes <= 3 and not d._timer_heap


async def test_answered_asks_do_not_pile_up_in_the_timer_heap() -> None:
    """Each ask sets a timeout that its answer cancels; the cancelled entries are dropped
    once they outnumber the live timers (`_compact_timers`), and a live timer set before
    them all still fires, once."""
    from deepserve.benchmarks.kernel_workloads import Asker, BPing, Echo
    from deepserve.core.asyncdriver import TIMER_HEAP_SLACK

    n = 3 * TIMER_HEAP_SLACK
    async with AsyncDriver(seed=1) as d:
        d.spawn("c/0", Counter)
        d.spawn("e/0", Echo)
        d.spawn("a/0", Asker, peer="e/0")
        await d.inject("c/0", SetTimer("late", 0.5, 7))  # live through all the asks
        await d.idle()
        await d.inject("a/0", BPing(n))
        await d.idle()
        assert d.cells["e/0"].stats.handled == n + 1  # its Started, and n asks
        assert len(d._timer_heap) <= 2 * len(d._timers) + TIMER_HEAP_SLACK + 1
        assert ("c/0", "late") in d._timers
        await d.idle(timers=True)
    assert d.actor("c/0").state.total == 7


async def test_no_timer_fires_after_the_driver_exits() -> None:
    # timers fire from a loop callback armed at the heap's top deadline (`_arm_timer`): the exit
    # disarms it, and a timer set at the exit arms nothing, so nothing is sent into a stopped driver
    async with AsyncDriver() as d:
        d.spawn("c/0", Counter)
        await d.inject("c/0", SetTimer("soon", 0.05, 1))
        await d.idle()
        assert d._timer_handle is not None
    assert d._timer_handle is None
    await anyio.sleep(0.1)
    assert d.timer_wakes == 0 and d.actor("c/0").state.total == 0


async def test_timers_fire_in_deadline_order_from_the_callback() -> None:
    async with AsyncDriver() as d:
        d.spawn("c/0", Counter)
        for key, delay, n in (("b", 0.06, 10), ("a", 0.02, 1), ("c", 0.04, 100)):
            await d.inject("c/0", SetTimer(key, delay, n))
        await anyio.sleep(0.2)
        assert d.actor("c/0").state.total == 111 and not d._timer_heap and d._timer_handle is None
