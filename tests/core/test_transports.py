"""Two AsyncDrivers exchange messages through a transport: in-process hub and
ZeroMQ sockets. Replies and asks cross the boundary; unknown addresses are dead."""

from __future__ import annotations

import anyio
import pytest
from kernel_actors import AskIt, Counter, Forward

from deepserve.adapters.zmq_transport import ZmqTransport
from deepserve.core import MemorySink
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.transport import InProcHub


async def _exchange(t_a, t_b) -> tuple[AsyncDriver, AsyncDriver, MemorySink]:
    sink_a = MemorySink()
    async with AsyncDriver(seed=1, sink=sink_a, transport=t_a) as a, AsyncDriver(
        seed=2, transport=t_b
    ) as b:
        a.spawn("a/0", Counter)
        b.spawn("b/0", Counter)
        await a.idle()
        await b.idle()
        for n in (1, 2, 3):
            await a.inject("a/0", Forward("b/0", n))
        await a.inject("a/0", AskIt("b/0", 2.0))  # the reply crosses back
        await a.inject("a/0", Forward("zz/9", 1))  # nobody owns zz/: a dead letter here
        with anyio.fail_after(5):
            while b.actor("b/0").state.total < 7 or not a.actor("a/0").state.total:
                await anyio.sleep(0.005)
        await a.idle()
    return a, b, sink_a


async def test_in_process_hub_connects_two_drivers():
    hub = InProcHub()
    a, b, sink = await _exchange(hub.transport(["a/"]), hub.transport(["b/"]))
    assert b.actor("b/0").state.total == 1 + 2 + 3 + 1
    assert a.actor("a/0").state.total == 7  # the ask's reply: b/0's total after the ask
    assert a.dead_letters == 1
    assert any(s.input.reply_to is not None and s.input.src == "b/0" for s in sink.steps)


@pytest.mark.timeout(30)
async def test_zeromq_sockets_connect_two_drivers():
    t_a = ZmqTransport(bind="tcp://127.0.0.1:*", routes={})
    t_b = ZmqTransport(bind="tcp://127.0.0.1:*", routes={"a/": t_a.endpoint})
    t_a.directory.set("b/", t_b.endpoint)
    a, b, _ = await _exchange(t_a, t_b)
    assert b.actor("b/0").state.total == 7 and a.actor("a/0").state.total == 7
    assert t_a.sent == 4 and t_b.sent == 1  # three tells and an ask out; one reply back


class RefusingTransport:
    """Owns `far/`, but every send is refused (a peer gone or far behind)."""

    def __init__(self) -> None:
        self.refused = 0

    def owns(self, addr: str) -> bool:
        return addr.startswith("far/")

    def send(self, env) -> bool:
        self.refused += 1
        return False

    def attach(self, deliver) -> None:
        return None

    def close(self) -> None:
        return None


async def test_a_send_the_transport_refuses_is_a_recorded_dead_letter():
    from deepserve.core.asyncdriver import AskError
    from deepserve.core.records import DEAD

    sink = MemorySink()
    transport = RefusingTransport()
    async with AsyncDriver(sink=sink, transport=transport) as d:
        d.spawn("a/0", Counter)
        await d.inject("a/0", Forward("far/1", 1))  # a tell: recorded
        await d.inject("a/0", AskIt("far/1", 5.0))  # an ask: AskFailed back at once
        await d.idle()
        with pytest.raises(AskError, match="transport refused"):
            await d.ask("far/2", Forward("a/0", 1), timeout_s=5.0)
    assert transport.refused == 3 and d.dead_letters == 3
    dead = [s.input for s in sink.steps if s.input.kind == DEAD]
    assert [(i.actor, i.src, i.type) for i in dead] == [
        ("far/1", "a/0", "Add"), ("far/1", "a/0", "Add"), ("far/2", "ext/ask", "Forward"),
    ]
    assert d.actor("a/0").state.notes == (
        "undelivered:Add#1:far/1:transport refused", "askfailed:transport refused",
    )


def test_a_route_matches_whole_path_segments_only() -> None:
    from deepserve.core.transport import longest_prefix

    routes = {"te/": "a", "hw/s0/npu1": "b", "hw/s0/": "c"}
    assert longest_prefix(routes, "te/3/dp/1") == "a"
    assert longest_prefix(routes, "hw/s0/npu1") == "b"
    assert longest_prefix(routes, "hw/s0/npu1/queue") == "b"
    assert longest_prefix(routes, "hw/s0/npu10") == "c"  # a sibling, not npu1's
    assert longest_prefix(routes, "hw/s1/npu1") is None
