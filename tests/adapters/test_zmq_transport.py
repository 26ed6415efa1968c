"""The ZeroMQ transport between real processes: backpressure, a peer restart, an
exit that loses nothing, directory updates at run time, bad endpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from zmq_child import Producer, ZcBurst, ZcItem

from deepserve.adapters.zmq import Directory, EndpointError, Limits, TransportError, ZmqTransport
from deepserve.core import Actor, Context, Message
from deepserve.core.asyncdriver import AsyncDriver

HERE = Path(__file__).parent
pytestmark = pytest.mark.timeout(60)


def _child(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, str(HERE / "zmq_child.py"), *args], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _start_receiver(endpoint: str, slow_us: int = 0, capacity: int = 1024) -> tuple[subprocess.Popen, str]:
    child = _child("receiver", endpoint, str(slow_us), str(capacity))
    line = child.stdout.readline()
    assert line.startswith("ready "), child.stderr.read()[-2000:]
    return child, line.split()[1]


def _summary(child: subprocess.Popen) -> dict:
    out, err = child.communicate(input="", timeout=30)
    assert child.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


async def _until(cond, timeout_s: float = 20.0) -> None:
    with anyio.fail_after(timeout_s):
        while not cond():
            await anyio.sleep(0.01)


async def test_a_sender_outrunning_a_slow_receiver_waits_and_loses_nothing() -> None:
    # 20,000 items against a receiver that takes 50 us each (>= 1 s), with a sender
    # allowed 1,024 pending: without waiting, all but ~1,000 would be refused.
    n = 20_000
    rx, endpoint = _start_receiver("tcp://127.0.0.1:*", slow_us=50, capacity=256)
    try:
        limits = Limits(window=256, high_water=512, max_pending=1024)
        transport = ZmqTransport(routes={"rx/": endpoint}, limits=limits)
        async with AsyncDriver(transport=transport) as d:
            d.spawn("tx/0", Producer)
            await d.inject("tx/0", ZcBurst(0, n))
            await d.idle()
            await _until(lambda: transport.unacknowledged() == 0, 40)
        assert transport.refused == 0 and d.dead_letters == 0
        assert transport.sent == n
    finally:
        got = _summary(rx)  # closing its stdin ends the receiver
    assert got["count"] == n and got["total"] == n * (n - 1) // 2
    assert got["full"] == 0  # the receiver stopped reading instead of dropping


async def test_a_restarted_peer_gets_everything_sent_while_it_was_down(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/rx.ipc"
    rx1, _ = _start_receiver(endpoint)
    transport = ZmqTransport(routes={"rx/": endpoint}, limits=Limits(resend_s=0.05))
    try:
        for i in range(1000):
            assert transport.send(_item(i))
        await _until(lambda: transport.unacknowledged() == 0)
        rx1.kill()  # kill -9: no goodbye
        rx1.wait(timeout=10)
        for i in range(1000, 2000):  # queued while nobody listens: accepted, not refused
            assert transport.send(_item(i))
        await anyio.sleep(0.3)
        rx2, _ = _start_receiver(endpoint)
        await _until(lambda: transport.unacknowledged() == 0)
        got = _summary(rx2)
    finally:
        assert await transport.aclose() == []
        for child in (rx1, locals().get("rx2")):
            if child is not None and child.poll() is None:
                child.kill()
    assert got["count"] == 1000 and got["total"] == sum(range(1000, 2000))
    assert transport.refused == 0


def _item(i: int):
    from deepserve.core.envelope import Envelope

    return Envelope("tx/0", "rx/0", i + 1, 0, None, ZcItem(i))


async def test_a_sender_exiting_right_after_sending_loses_nothing() -> None:
    got: list = []
    receiver = ZmqTransport(bind="tcp://127.0.0.1:*")
    receiver.attach(got.append)
    n = 30_000
    tx = _child("sender", receiver.endpoint or "", str(n))
    try:
        with anyio.fail_after(40):
            while tx.poll() is None:
                await anyio.sleep(0.02)
        summary = _summary(tx)
        assert summary == {"sent": n, "refused": 0, "dead_letters": 0}
        # The sender had every item acknowledged before it exited: all are here already.
        assert len(got) == n
        assert sorted(e.msg.n for e in got) == list(range(n))
    finally:
        receiver.close()
        if tx.poll() is None:
            tx.kill()


async def test_directory_updates_take_effect_on_the_next_send(tmp_path: Path) -> None:
    got1: list = []
    got2: list = []
    b1 = ZmqTransport(bind=f"ipc://{tmp_path}/b1.ipc")
    b2 = ZmqTransport(bind=f"ipc://{tmp_path}/b2.ipc")
    b1.attach(got1.append)
    b2.attach(got2.append)
    directory = Directory({"x/": b1.endpoint})
    a = ZmqTransport(routes=directory)
    try:
        assert a.send(_env("x/1", 1)) and not a.owns("y/1")
        directory.set("x/", b2.endpoint)  # the cluster manager moved x/
        directory.set("x/9", b1.endpoint)  # a longer prefix wins
        assert a.send(_env("x/1", 2)) and a.send(_env("x/9", 3))
        directory.remove("x/9")
        assert a.send(_env("x/9", 4))
        assert not a.send(_env("y/1", 5)) and a.refused == 1  # nobody owns y/
        await _until(lambda: a.unacknowledged() == 0)
        assert [e.msg.n for e in got1] == [1, 3] and [e.msg.n for e in got2] == [2, 4]
    finally:
        assert await a.aclose() == []
        b1.close()
        b2.close()


def _env(dst: str, n: int):
    from deepserve.core.envelope import Envelope

    return Envelope("a/0", dst, n, 0, None, ZcItem(n))


async def test_an_unacknowledged_envelope_at_close_is_a_recorded_dead_letter() -> None:
    from deepserve.core import MemorySink
    from deepserve.core.records import DEAD

    sink = MemorySink()
    # A peer that never answers: nothing listens on this port.
    transport = ZmqTransport(routes={"rx/": "tcp://127.0.0.1:9"}, limits=Limits(close_timeout_s=0.2))
    async with AsyncDriver(sink=sink, transport=transport) as d:
        d.spawn("tx/0", Producer)
        await d.inject("tx/0", ZcBurst(0, 3))
        await d.idle()
    dead = [s.input for s in sink.steps if s.input.kind == DEAD]
    assert [(i.actor, i.src, i.type) for i in dead] == [("rx/0", "tx/0", "ZcItem")] * 3
    assert d.dead_letters == 3


def test_bad_endpoints_are_refused_naming_the_problem(tmp_path: Path) -> None:
    with pytest.raises(EndpointError, match=r"bind endpoint 'localhost:5555': scheme must be ipc://"):
        ZmqTransport(bind="localhost:5555")
    with pytest.raises(EndpointError, match=r"directory entry 'te/' 'tcp://host': tcp:// needs HOST:PORT"):
        Directory({"te/": "tcp://host"})
    with pytest.raises(EndpointError, match=r"port must be 1..65535"):
        Directory().set("te/", "tcp://127.0.0.1:*")  # a wildcard binds, it cannot be reached
    with pytest.raises(EndpointError, match=r"ipc path longer than 107 bytes"):
        ZmqTransport(routes={"a/": "ipc://" + "x" * 200})
    taken = ZmqTransport(bind=f"ipc://{tmp_path}/taken.ipc")
    try:
        other = ZmqTransport(bind="tcp://127.0.0.1:*")
        port = (other.endpoint or "").rsplit(":", 1)[1]
        with pytest.raises(TransportError, match=rf"cannot bind tcp://127.0.0.1:{port}: Address already in use"):
            ZmqTransport(bind=f"tcp://127.0.0.1:{port}")
        other.close()
    finally:
        taken.close()
    with pytest.raises(ValueError, match="window <= high_water"):
        Limits(window=10, high_water=5)


async def test_the_first_envelope_to_an_idle_peer_leaves_at_once_and_a_burst_batches(tmp_path: Path) -> None:
    # A round trip must not wait for a turn of the loop; a flood still leaves in batches.
    import zmq

    from deepserve.adapters.zmq.frames import receive_and_ack

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc://{tmp_path}/rx.ipc")
    transport = ZmqTransport(routes={"rx/": f"ipc://{tmp_path}/rx.ipc"})
    try:
        assert transport.send(_item(0))
        assert router.poll(5000), "the first envelope did not leave before the loop turned"
        assert [w.msg_id for w in receive_and_ack(router)] == [1]
        await anyio.sleep(0)  # the turn ends (its scheduled flush finds nothing more)
        for i in range(1, 301):  # one turn of the loop: the first at once, the rest in one frame
            assert transport.send(_item(i))
        assert router.poll(5000)
        frames = [receive_and_ack(router)]
        await anyio.sleep(0)  # the scheduled flush
        while router.poll(500):
            frames.append(receive_and_ack(router))
        assert [len(f) for f in frames] == [1, 299]
        assert [w.msg_id for f in frames for w in f] == list(range(2, 302))
    finally:
        assert await transport.aclose() == []
        router.close(linger=0)
        ctx.term()


async def test_replies_sent_in_the_receive_callback_leave_before_it_returns(tmp_path: Path) -> None:
    # What a receive callback sends (the replies of inline deliveries) is flushed when the
    # callback ends, with no loop callback per reply: the first reply at once, the rest of the
    # callback's sends as one batch, all on the wire before the callback returns.
    import zmq

    from deepserve.adapters.zmq.frames import receive_and_ack
    from deepserve.core.envelope import Envelope

    ctx = zmq.Context()
    out = ctx.socket(zmq.ROUTER)
    out.bind(f"ipc://{tmp_path}/out.ipc")
    rx = ZmqTransport(bind=f"ipc://{tmp_path}/rx.ipc", routes={"out/": f"ipc://{tmp_path}/out.ipc"})
    tx = ZmqTransport(routes={"rx/": f"ipc://{tmp_path}/rx.ipc"})
    seen: list[int] = []

    def deliver(env: Envelope) -> None:  # three replies per envelope received
        seen.append(env.msg_id)
        for k in range(3):
            assert rx.send(Envelope("rx/0", "out/0", 10 * env.msg_id + k, 0, None, ZcItem(k)))

    try:
        rx.attach(deliver)
        rx._stop_reading()  # this test runs the receive callback itself
        assert tx.send(_item(0))
        assert rx._router is not None and rx._router.poll(5000)
        rx._drain()  # the callback, with no turn of the loop after it
        assert seen == [1]
        frames = []
        while out.poll(500):
            frames.append([w.msg_id for w in receive_and_ack(out)])
        assert frames == [[10], [11, 12]]
        assert not rx.peers[f"ipc://{tmp_path}/out.ipc"].scheduled
    finally:
        assert await tx.aclose() == []
        assert await rx.aclose() == []
        out.close(linger=0)
        ctx.term()


_SINK_GOT: list[int] = []


class _Sink(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        _SINK_GOT.append(msg.n)  # type: ignore[attr-defined]


async def test_a_foreign_frame_is_counted_and_dropped_and_delivery_goes_on(tmp_path: Path) -> None:
    # A stray client on our port: a garbage frame, then a three-part message. Both are
    # dropped whole (the next read starts a message), counted, and the node keeps
    # delivering what its peers send.
    import zmq

    got = _SINK_GOT
    got.clear()
    rx = ZmqTransport(bind=f"ipc://{tmp_path}/rx.ipc")
    tx = ZmqTransport(routes={"rx/": f"ipc://{tmp_path}/rx.ipc"})
    ctx = zmq.Context()
    stray = ctx.socket(zmq.DEALER)
    stray.connect(f"ipc://{tmp_path}/rx.ipc")
    try:
        async with AsyncDriver(transport=rx) as d:
            d.spawn("rx/0", _Sink)
            stray.send(b"\xc1not msgpack")
            stray.send_multipart([b"\x93\x01", b"two", b"three"])
            await _until(lambda: rx.malformed == 2)
            tx.attach(lambda env: None)
            for i in range(3):
                assert tx.send(_item(i))
            await _until(lambda: len(got) == 3)
            assert got == [0, 1, 2] and rx.malformed == 2 and rx.received == 3
    finally:
        assert await tx.aclose() == []
        stray.close(linger=0)
        ctx.term()
