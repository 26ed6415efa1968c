"""One ask contract: every failure names request, target and reason the same way
(inside: `AskFailed` with `env.reply_to` set; outside: `AskError`); a reply after
its ask failed is recorded, not delivered; `SimDriver.ask` in virtual time."""

from __future__ import annotations

import anyio
import pytest
from kernel_actors import Add, Asker, AskIt, Counter, Forward, SetTimer, Slow

from deepserve.core import AskError, AsyncDriver, MemorySink, SimDriver
from deepserve.core.records import LATE
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify


def test_timeout_and_dead_target_failures_carry_the_same_fields():
    sink = MemorySink()
    d = SimDriver(sink=sink)
    d.spawn("a/0", Asker)
    d.spawn("s/0", Slow, delay_s=2.0)
    d.inject("a/0", AskIt("nobody/1", 1.0), at=0.0)
    d.inject("a/0", AskIt("s/0", 1.0), at=5.0)
    d.run()
    assert d.actor("a/0").state == (
        "asked:1", "failed:1:1:nobody/1:target is dead",
        "asked:4", "failed:4:4:s/0:timeout after 1.0s",  # reply_to set, as for a dead target
    )
    # The answer came at t=7, after the timeout at t=6: recorded, not delivered.
    late = [s.input for s in sink.steps if s.input.kind == LATE]
    assert [(i.actor, i.src, i.reply_to, i.t) for i in late] == [("a/0", "s/0", 4, 7.0)]
    assert d.late_replies == 1
    assert verify(MemoryLog(sink)).identical


def test_a_reply_in_time_is_delivered_and_cancels_the_timeout():
    d = SimDriver()
    d.spawn("a/0", Asker)
    d.spawn("s/0", Slow, delay_s=0.5)
    d.inject("a/0", AskIt("s/0", 1.0))
    d.run()
    assert d.actor("a/0").state == ("asked:1", "reply:1:7")
    assert d.late_replies == 0


def test_sim_driver_external_ask_in_virtual_time():
    sink = MemorySink()
    d = SimDriver(sink=sink)
    d.spawn("c/0", Counter)
    d.spawn("s/0", Slow, delay_s=2.0)
    assert d.ask("c/0", Add(5), timeout_s=1.0) == Add(5)
    with pytest.raises(AskError) as dead:
        d.ask("nobody/0", Add(1), timeout_s=1.0)
    assert (dead.value.target, dead.value.reason) == ("nobody/0", "target is dead")
    before = d.now
    with pytest.raises(AskError) as slow:
        d.ask("s/0", Add(1), timeout_s=1.5)
    assert (slow.value.target, slow.value.reason) == ("s/0", "timeout after 1.5s")
    assert d.now == before + 1.5  # virtual time, not wall time
    d.run()  # the answer comes at +2.0: recorded as late, not handed to anyone
    assert d.late_replies == 1 and list(d.external_out) == []
    late = [s.input for s in sink.steps if s.input.kind == LATE]
    assert [(i.actor, i.reply_to) for i in late] == [("ext/ask", slow.value.request_id)]
    with pytest.raises(ValueError, match="positive timeout_s"):
        d.ask("c/0", Add(1), timeout_s=0)


async def test_async_driver_ask_errors_name_request_target_and_reason():
    sink = MemorySink()
    async with AsyncDriver(sink=sink) as d:
        d.spawn("c/0", Counter)
        d.spawn("s/0", Slow, delay_s=0.1)
        with pytest.raises(AskError) as dead:
            await d.ask("nobody/0", Add(1), timeout_s=1.0)
        assert dead.value.reason == "target is dead" and dead.value.target == "nobody/0"
        with pytest.raises(AskError) as slow:
            await d.ask("s/0", Add(1), timeout_s=0.02)
        assert (slow.value.target, slow.value.reason) == ("s/0", "timeout after 0.02s")
        assert slow.value.request_id > dead.value.request_id > 0
        await anyio.sleep(0.2)
    assert d.late_replies == 1 and list(d.external_out) == []


async def test_idle_waits_for_timers_only_when_asked():
    async with AsyncDriver() as d:
        d.spawn("c/0", Counter)
        await d.inject("c/0", SetTimer("t", 0.05, 3))
        await d.idle()
        assert d.actor("c/0").state.total == 0  # the timer is still pending
        with anyio.fail_after(2):
            await d.idle(timers=True)
        assert d.actor("c/0").state.total == 3
        await d.inject("c/0", Forward("c/0", 1))
        await d.idle(timers=True)
        assert d.actor("c/0").state.total == 4
