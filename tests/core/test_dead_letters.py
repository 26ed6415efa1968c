"""A tell to a stopped (or absent) actor is a recorded dead letter, and its sender is
told with `Undelivered`, as for a full mailbox; timers and kernel notices never
make notices (no loops). Both drivers."""

from __future__ import annotations

import anyio
from kernel_actors import Counter, Forward, SetTimer, StopSelf

from deepserve.core import AsyncDriver, MemorySink, SimDriver
from deepserve.core.records import DEAD

TOLD = "undelivered:Add#1:c/1:target is dead"


def test_sim_tell_to_a_stopped_actor_tells_its_sender():
    sink = MemorySink()
    d = SimDriver(sink=sink)
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    d.inject("c/1", StopSelf(), at=1.0)
    d.inject("c/0", Forward("c/1", 5), at=2.0)
    d.run()
    dead = [s.input for s in sink.steps if s.input.kind == DEAD]
    assert [(i.actor, i.src, i.type) for i in dead] == [("c/1", "c/0", "Add")]
    assert d.actor("c/0").state.notes == (TOLD,)
    assert d.dead_letters == 1


def test_sim_tell_to_an_address_nobody_holds_tells_its_sender():
    d = SimDriver()
    d.spawn("c/0", Counter)
    d.inject("c/0", Forward("nobody/0", 1))
    d.run()
    assert d.actor("c/0").state.notes == ("undelivered:Add#1:nobody/0:target is dead",)


def test_timers_of_a_stopped_actor_and_notices_to_the_dead_make_no_notices():
    # c/1 stops with a timer pending (a dead letter to itself: nobody to tell), and
    # c/0 stops after sending to it: the notice to c/0 is a dead letter, told to nobody.
    sink = MemorySink()
    d = SimDriver(sink=sink)
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    d.inject("c/1", SetTimer("k", 5.0, 1), at=1.0)
    d.inject("c/1", StopSelf(), at=2.0)
    d.inject("c/0", Forward("c/1", 1), at=3.0)
    d.inject("c/0", StopSelf(), at=3.0)
    d.run()
    dead = [(s.input.actor, s.input.src, s.input.type) for s in sink.steps if s.input.kind == DEAD]
    assert dead == [("c/1", "c/1", "Add"), ("c/1", "c/0", "Add"), ("c/0", "c/1", "Undelivered")]
    assert d.pending() == 0


def test_async_tell_to_a_stopped_actor_tells_its_sender():
    async def main() -> tuple[tuple[str, ...], int]:
        async with AsyncDriver(seed=1) as d:
            d.spawn("c/0", Counter)
            d.spawn("c/1", Counter)
            d.inject_nowait("c/1", StopSelf())
            await d.idle()
            d.inject_nowait("c/0", Forward("c/1", 5))
            await d.idle()
            return d.actor("c/0").state.notes, d.dead_letters

    notes, dead = anyio.run(main)
    assert notes == (TOLD,) and dead == 1
