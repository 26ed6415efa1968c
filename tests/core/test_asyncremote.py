"""AsyncDriver's side of a flow-controlled transport (core/asyncremote.py): a remote envelope
for a mailbox at its high-water mark waits for the actor's takes (not a poll of the loop), under
asyncio and under uvloop (the daemon's loop); a failure where the transport delivers fails the
driver. The transport here is an in-process stand-in with ZmqTransport's flow-control surface
(`attach_admit`, `congestion`, `aclose`): a waiting admission runs in a task of its own, as there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

import anyio
import msgspec
import pytest

from deepserve.core import Actor, Context, Event, MemorySink, Message
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.envelope import Envelope
from deepserve.core.records import Step

LOOPS = ["asyncio", "uvloop"]
pytestmark = pytest.mark.timeout(60)


class ArItem(Message, frozen=True):
    n: int


class ArHold(Message, frozen=True):
    """Its handler sends to the congested peer: the actor's task then waits for the peer."""


class ArPing(Message, frozen=True):
    pass


class ArGot(Event, frozen=True):
    n: int


class Seen(msgspec.Struct, frozen=True):
    got: tuple[int, ...] = ()


class ArKeeper(Actor[Seen]):
    """Records the items it gets, in order; stops at a negative one."""

    def initial_state(self) -> Seen:
        return Seen()

    def evolve(self, state: Seen, event: Event) -> Seen:
        assert isinstance(event, ArGot)
        return Seen((*state.got, event.n))

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, ArHold):
            ctx.send("peer/0", ArPing())
        elif isinstance(msg, ArItem):
            ctx.record(ArGot(msg.n))
            if msg.n < 0:
                ctx.stop()


class Flow:
    """A transport whose one peer is congested until `gate` is set. Envelopes arrive through
    `receive`, which admits them as ZmqTransport's receive callback does."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.sent = 0
        self.admit: Callable[[Envelope], Awaitable[None] | None] | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    def owns(self, addr: str) -> bool:
        return addr.startswith("peer/")

    def send(self, env: Envelope) -> bool:
        self.sent += 1
        return True

    def congestion(self) -> asyncio.Event | None:
        return None if self.gate.is_set() else self.gate

    def attach_admit(self, admit: Callable[[Envelope], Awaitable[None] | None]) -> None:
        self.admit = admit

    def attach(self, deliver: Callable[[Envelope], None]) -> None:
        raise AssertionError("a flow-controlled transport is attached with attach_admit")

    def receive(self, n: int) -> Awaitable[None] | None:
        assert self.admit is not None
        return self.admit(Envelope("peer/0", "rx/0", n + 1000, 0, None, ArItem(n)))

    def receive_later(self, n: int) -> None:
        """Like ZmqTransport's receive callback (a loop callback): a waiting admission runs in
        a task that nobody awaits."""
        waiting = self.receive(n)
        if waiting is not None:
            task = asyncio.get_running_loop().create_task(waiting)  # type: ignore[arg-type]
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def aclose(self) -> list[Envelope]:
        return []

    def close(self) -> None:
        pass


class Resumptions:
    """Awaits a coroutine, counting how often the event loop resumes it."""

    def __init__(self, coro: Awaitable[None]) -> None:
        assert isinstance(coro, Coroutine)
        self.coro = coro
        self.resumed = 0

    def __await__(self) -> Generator[Any, Any, None]:
        value: Any = None
        exc: BaseException | None = None
        while True:
            try:
                pending = self.coro.throw(exc) if exc is not None else self.coro.send(value)
            except StopIteration:
                return
            try:
                value, exc = (yield pending), None
            except BaseException as e:  # noqa: BLE001 — a cancellation, handed on to the coroutine
                value, exc = None, e
            self.resumed += 1


def _run(main: Callable[[], Awaitable[None]], loop: str) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": loop == "uvloop"})


async def _hold(d: AsyncDriver, flow: Flow) -> None:
    """Start rx/0 and keep its task waiting for the congested peer (until `flow.gate` is set)."""
    d.spawn("rx/0", ArKeeper)
    d.inject_nowait("rx/0", ArHold())
    with anyio.fail_after(10):  # until its task waits for the peer
        while not flow.sent or d._remote_pressure is not None:
            await anyio.sleep(0.001)


async def _held_at_high_water(d: AsyncDriver, flow: Flow, first: int = 0) -> Awaitable[None]:
    """`_hold`, then fill rx/0's mailbox to the high-water mark with items `first`.. through
    the transport; return the next item's waiting admission."""
    await _hold(d, flow)
    for n in range(first, first + d._high_water):
        assert flow.receive(n) is None  # queued: its task is not parked on its mailbox
    waiting = flow.receive(first + d._high_water)
    assert waiting is not None
    return waiting


@pytest.mark.parametrize("loop", LOOPS)
def test_a_remote_envelope_for_a_full_mailbox_is_woken_by_a_take_not_a_poll(loop: str) -> None:
    # The old wait polled `sleep(0.0005)` for as long as the mailbox stayed full: hundreds of
    # wake-ups in the 0.3 s hold under asyncio, a spin under uvloop (a sub-ms sleep is 0 there).
    n_items = 40
    counts: dict[str, int] = {}

    async def main() -> None:
        flow = Flow()
        async with AsyncDriver(transport=flow, mailbox_capacity=8) as d:
            d.max_remote_wait_s = 30.0  # the hold, not the bound, ends the waits here
            counted = Resumptions(await _held_at_high_water(d, flow))
            done = anyio.Event()

            async def admit() -> None:
                await counted
                done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(admit)
                await anyio.sleep(0.3)  # the hold: the actor takes nothing
                counts["held"] = counted.resumed
                assert not done.is_set()
                flow.gate.set()
                with anyio.fail_after(10):
                    await done.wait()
            counts["total"] = counted.resumed
            for n in range(d._high_water + 1, n_items):  # the rest, as the transport would
                waiting = flow.receive(n)
                if waiting is not None:
                    await waiting
            await d.idle()
            assert d.actor("rx/0").state.got == tuple(range(n_items))  # nothing lost or reordered
            assert d.mailbox_full == 0 and d.dead_letters == 0

    _run(main, loop)
    assert counts["held"] == 0, counts  # nothing taken, nothing to wake it
    assert counts["total"] <= 2, counts  # the first take lets it in


@pytest.mark.parametrize("loop", LOOPS)
def test_a_waiting_remote_envelope_still_gives_up_after_max_remote_wait_s(loop: str) -> None:
    async def main() -> None:
        flow = Flow()
        async with AsyncDriver(transport=flow, mailbox_capacity=8) as d:
            d.max_remote_wait_s = 30.0  # the actor's own wait for the peer (started below)
            waiting = await _held_at_high_water(d, flow)
            d.max_remote_wait_s = 0.2
            start = time.monotonic()
            with anyio.fail_after(10):
                await waiting
            waited_s = time.monotonic() - start
            assert 0.15 <= waited_s < 10, waited_s
            assert d.actor("rx/0").state.got == ()  # still held: sent past the mark, below capacity
            flow.gate.set()
            await d.idle()
            assert d.actor("rx/0").state.got == tuple(range(d._high_water + 1))

    _run(main, loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_waiting_remote_envelope_is_woken_when_its_actor_stops(loop: str) -> None:
    # Its mailbox is drained as dead letters (takes): the waiting envelope is one more, at once.
    async def main() -> None:
        flow = Flow()
        async with AsyncDriver(transport=flow, mailbox_capacity=8) as d:
            d.max_remote_wait_s = 30.0
            waiting = await _held_at_high_water(d, flow, first=-1)  # -1 stops it
            flow.gate.set()
            with anyio.fail_after(10):  # far below max_remote_wait_s
                await waiting
            with pytest.raises(KeyError):  # stopped
                d.actor("rx/0")
            assert d.dead_letters == d._high_water  # three drained, then the one that waited

    _run(main, loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_remote_envelope_for_an_empty_mailbox_does_not_wait_at_a_mark_of_0(loop: str) -> None:
    # `mailbox_capacity` 1: the high-water mark is 0, so every remote envelope is admitted
    # through the wait, which no take would ever end (it lasted `max_remote_wait_s`).
    async def main() -> None:
        flow = Flow()
        async with AsyncDriver(transport=flow, mailbox_capacity=1) as d:
            d.max_remote_wait_s = 30.0
            d.spawn("rx/0", ArKeeper)
            for n in range(3):
                await d.idle()
                waiting = flow.receive(n)
                if waiting is not None:
                    with anyio.fail_after(10):
                        await waiting
            await d.idle()
            assert d.actor("rx/0").state.got == (0, 1, 2)

    _run(main, loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_waiter_giving_up_leaves_the_others_waiting(loop: str) -> None:
    # The waiters of a full mailbox share one future: an edge sender's deadline cancelled it
    # under the others (a CancelledError in a task nobody cancelled), until the next take.
    async def main() -> None:
        flow = Flow()
        async with AsyncDriver(transport=flow, mailbox_capacity=8) as d:
            d.max_remote_wait_s = 30.0
            await _hold(d, flow)
            for n in range(d.edge_limit):  # the edge is full: `inject` waits
                assert flow.receive(n) is None
            accepted: list[int] = []

            async def patient() -> None:
                accepted.append(await d.inject("rx/0", ArItem(100)))

            async with anyio.create_task_group() as tg:
                tg.start_soon(patient)
                with anyio.fail_after(10):
                    while d.cells["rx/0"].mailbox._space is None:  # until it waits
                        await anyio.sleep(0.001)
                with anyio.move_on_after(0.05):  # an impatient one gives up
                    await d.inject("rx/0", ArItem(200))
                with anyio.fail_after(10):  # ... and one that comes after it waits too
                    async with anyio.create_task_group() as late:
                        late.start_soon(patient)
                        await anyio.sleep(0.05)
                        assert accepted == []
                        flow.gate.set()
            await d.idle()
            assert len(accepted) == 2 and all(accepted)
            assert d.actor("rx/0").state.got == (*range(d.edge_limit), 100, 100)

    _run(main, loop)


class RefusingSink(MemorySink):
    """Refuses the steps `refuse` picks: a disk failing at that moment (tests/adapters'
    receive-failure test uses it too)."""

    def __init__(self, refuse: Callable[[Step], bool]) -> None:
        super().__init__()
        self.refuse = refuse

    def append(self, step: Step) -> int:
        if self.refuse(step):
            raise OSError("disk full")
        return super().append(step)


def _fails_with_disk_full(main: Callable[[], Awaitable[None]], loop: str) -> None:
    with pytest.raises(ExceptionGroup) as failed:  # the driver's task group, failed by the OSError
        _run(main, loop)
    assert any(isinstance(e, OSError) and "disk full" in str(e) for e in failed.value.exceptions)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_log_failure_delivering_a_remote_envelope_inline_fails_the_driver(loop: str) -> None:
    async def main() -> None:
        flow = Flow()
        async with AsyncDriver(transport=flow, sink=RefusingSink(lambda step: step.input.msg_id == 1000 + 0)) as d:
            d.spawn("rx/0", ArKeeper)
            await d.idle()
            # rx/0 is parked: its step runs in the receive callback, a callback of the loop
            asyncio.get_running_loop().call_soon(flow.receive_later, 0)
            with anyio.fail_after(10):
                await anyio.sleep_forever()

    _fails_with_disk_full(main, loop)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_log_failure_after_a_remote_envelope_waited_fails_the_driver(loop: str) -> None:
    # The waiting envelope ends as a dead letter (its actor stopped), in the transport's task.
    async def main() -> None:
        flow = Flow()
        sink = RefusingSink(lambda step: step.input.msg_id == 1000 + 3)  # the dead letter of item 3
        async with AsyncDriver(transport=flow, sink=sink, mailbox_capacity=8) as d:
            d.max_remote_wait_s = 30.0
            await _hold(d, flow)
            for n in (-1, 0, 1, 2):  # up to the high-water mark; -1 stops rx/0, the rest drained
                assert flow.receive(n) is None
            flow.receive_later(3)  # waits in a task of the transport's, as ZmqTransport's does
            assert flow.tasks
            flow.gate.set()
            with anyio.fail_after(10):
                await anyio.sleep_forever()

    _fails_with_disk_full(main, loop)
