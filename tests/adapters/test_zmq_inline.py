"""A remote envelope for an idle actor runs in the transport's receive callback
(`AsyncDriver._run_inline`): two drivers over real ipc:// sockets in one loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
import pytest

from deepserve.adapters.zmq import ZmqTransport
from deepserve.core import Actor, AsyncDriver, Context, MemorySink, Message
from deepserve.core.records import DEAD

pytestmark = pytest.mark.timeout(60)


class ZiPing(Message, frozen=True):
    n: int


class ZiQuit(Message, frozen=True):
    pass


class Echo(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, ZiPing):
            ctx.reply(ZiPing(msg.n))
        elif isinstance(msg, ZiQuit):
            ctx.stop()


SEEN: list[int] = []  # the answers Asker got (the test's instrument, not actor state)


class Asker(Actor[None]):
    """Asks `e/0` `ZiPing(n)` for n = 1..3, one after the other."""

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, ZiPing):
            if ctx.sender != "e/0":  # the start
                ctx.ask("e/0", ZiPing(1), 5.0)
                return
            SEEN.append(msg.n)
            if msg.n < 3:
                ctx.ask("e/0", ZiPing(msg.n + 1), 5.0)


def _pair(tmp: Path) -> tuple[ZmqTransport, ZmqTransport]:
    a_ep, b_ep = f"ipc://{tmp}/a.ipc", f"ipc://{tmp}/b.ipc"
    return ZmqTransport(bind=a_ep, routes={"e/": b_ep}), ZmqTransport(bind=b_ep, routes={"c/": a_ep})


async def _until(cond, timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        while not cond():
            await anyio.sleep(0.005)


async def test_round_trips_to_idle_actors_run_inline_and_are_logged_like_any_delivery(tmp_path: Path) -> None:
    SEEN.clear()
    ta, tb = _pair(tmp_path)
    sa, sb = MemorySink(), MemorySink()
    async with AsyncDriver(sink=sa, transport=ta) as a, AsyncDriver(sink=sb, transport=tb) as b:
        b.spawn("e/0", Echo)
        asker = a.spawn("c/0", Asker)
        await a.inject(asker, ZiPing(0))
        await _until(lambda: len(SEEN) == 3)
        # Every remote delivery found its actor parked: three asks in e/0, three answers in c/0.
        assert (a.inline_deliveries, b.inline_deliveries) == (3, 3)
        assert SEEN == [1, 2, 3]
    # Logged like any delivery: e/0's steps hold the three asks, each answered.
    pings = [s for s in sb.steps if s.input.actor == "e/0" and s.input.type == "ZiPing"]
    assert [len(s.outputs) for s in pings] == [1, 1, 1]


async def test_an_actor_stopped_by_an_inline_delivery_leaves_and_later_mail_is_dead(tmp_path: Path) -> None:
    ta, tb = _pair(tmp_path)
    sb = MemorySink()
    async with AsyncDriver(transport=ta) as a, AsyncDriver(sink=sb, transport=tb) as b:
        b.spawn("e/0", Echo)
        a.spawn("c/0", Asker)
        await anyio.sleep(0.05)  # e/0's task parks on its empty mailbox
        a.inject_nowait("e/0", ZiQuit(), src="ext/test")
        await _until(lambda: b.inline_deliveries == 1 and "e/0" not in b.cells)
        await _until(lambda: "actor e/0" not in {t.get_name() for t in asyncio.all_tasks()})  # its task left
        a.inject_nowait("e/0", ZiPing(7), src="ext/test")
        await _until(lambda: any(s.input.kind == DEAD for s in sb.steps))
        b.spawn("e/0", Echo)  # the address is free again: its old task has gone
        await anyio.sleep(0.05)
        SEEN.clear()
        await a.inject("c/0", ZiPing(0))
        await _until(lambda: len(SEEN) == 3)
