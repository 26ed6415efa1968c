"""The kernel benchmark's workloads and the bare baselines they are compared with.

Each function returns a rate measured on this machine, now; nothing is cached or
assumed. Sizes are chosen so each measurement takes about a second."""

from __future__ import annotations

import asyncio
import resource
import time
from heapq import heappop, heappush

from deepserve.core import Actor, Context, Message, SimDriver
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.records import LogSink

Rates = tuple[float, float]  # (per wall second, per CPU second)


def _cpu_s() -> float:
    """CPU seconds of this process (all its threads) and of its reaped children (the
    log writer process, once closed)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ru.ru_utime + ru.ru_stime


class Clock:
    """Wall and CPU time from its creation. On a loaded machine wall time includes
    the time others ran; CPU time is the work done, threads and writer included."""

    def __init__(self) -> None:
        self.wall0 = time.perf_counter()
        self.cpu0 = _cpu_s()

    def rates(self, n: float) -> Rates:
        wall, cpu = time.perf_counter() - self.wall0, _cpu_s() - self.cpu0
        return n / wall, n / max(cpu, 1e-9)


class BPing(Message, frozen=True):
    n: int


class BTick(Message, frozen=True):
    left: int


class Bouncer(Actor[None]):
    """Sends the counter back to its peer until it reaches zero."""

    def __init__(self, peer: str) -> None:
        self.peer = peer

    def handle(self, ctx: Context, msg: Message) -> None:
        if type(msg) is BPing and msg.n > 0:  # type: ignore[attr-defined]
            ctx.send(self.peer, BPing(msg.n - 1))  # type: ignore[attr-defined]


class Streamer(Actor[None]):
    """Each tick sends a batch one way, then ticks itself again."""

    batch = 64

    def __init__(self, peer: str) -> None:
        self.peer = peer

    def handle(self, ctx: Context, msg: Message) -> None:
        if type(msg) is BTick and msg.left > 0:  # type: ignore[attr-defined]
            for _ in range(self.batch):
                ctx.send(self.peer, BPing(0))
            ctx.send(ctx.self, BTick(msg.left - 1))  # type: ignore[attr-defined]


class Drain(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        return None


class Echo(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        ctx.reply(msg)


class Asker(Actor[None]):
    """Asks its peer, and on each reply asks again until the count runs out."""

    def __init__(self, peer: str) -> None:
        self.peer = peer

    def handle(self, ctx: Context, msg: Message) -> None:
        if type(msg) is BPing and msg.n > 0:  # type: ignore[attr-defined]
            ctx.ask(self.peer, BPing(msg.n - 1), timeout_s=30.0)  # type: ignore[attr-defined]


# ---- SimDriver ---------------------------------------------------------------


def sim_pingpong(n: int, sink: LogSink | None = None) -> Rates:
    """Deliveries/s of a two-actor ping-pong; a given sink is closed by the run."""
    d = SimDriver(seed=1, sink=sink)
    d.spawn("b/0", Bouncer, peer="b/1")
    d.spawn("b/1", Bouncer, peer="b/0")
    d.run()
    d.inject("b/0", BPing(n))
    clock = Clock()
    delivered = d.run()
    if sink is not None:
        sink.close()  # timed: the log is complete (every step committed, file closed)
    return clock.rates(delivered)


def heapq_loop(n: int) -> float:
    """The floor under any discrete-event loop: the same ping-pong as bare tuples on
    a heap, each pop dispatched to a handler function that schedules the next."""
    heap: list[tuple[float, int, str, int]] = []
    peers = {"b/0": "b/1", "b/1": "b/0"}
    seq = 0

    def bounce(t: float, dst: str, count: int) -> None:
        nonlocal seq
        if count > 0:
            seq += 1
            heappush(heap, (t, seq, peers[dst], count - 1))

    handlers = {"b/0": bounce, "b/1": bounce}
    heappush(heap, (0.0, 0, "b/0", n))
    delivered = 0
    t0 = time.perf_counter()
    while heap:
        t, _, dst, count = heappop(heap)
        handlers[dst](t, dst, count)
        delivered += 1
    return delivered / (time.perf_counter() - t0)


# ---- AsyncDriver -----------------------------------------------------------------


async def _async_stream(ticks: int) -> Rates:
    async with AsyncDriver(seed=1) as d:
        d.spawn("s/0", Streamer, peer="s/1")
        d.spawn("s/1", Drain)
        await d.idle()
        clock = Clock()
        d.inject_nowait("s/0", BTick(ticks))
        await d.idle()
        if d.mailbox_full:
            raise RuntimeError("the stream benchmark must not drop")
        return clock.rates(d.cells["s/1"].stats.handled)


async def _async_asks(n: int) -> Rates:
    async with AsyncDriver(seed=1) as d:
        d.spawn("e/0", Echo)
        d.spawn("a/0", Asker, peer="e/0")
        await d.idle()
        clock = Clock()
        d.inject_nowait("a/0", BPing(n))
        await d.idle()
        return clock.rates(n)


async def _queue_stream(n: int) -> float:
    q: asyncio.Queue[int] = asyncio.Queue(1024)

    async def consume() -> None:
        for _ in range(n):
            await q.get()

    t0 = time.perf_counter()
    task = asyncio.create_task(consume())
    for i in range(n):
        await q.put(i)
    await task
    return n / (time.perf_counter() - t0)


async def _future_roundtrips(n: int) -> float:
    """A request/reply floor: one Future per request answered by another task."""
    requests: asyncio.Queue[asyncio.Future[int]] = asyncio.Queue()

    async def server() -> None:
        while True:
            fut = await requests.get()
            fut.set_result(1)

    task = asyncio.create_task(server())
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    for _ in range(n):
        fut = loop.create_future()
        requests.put_nowait(fut)
        await fut
    elapsed = time.perf_counter() - t0
    task.cancel()
    return n / elapsed


def pykka_tell(n: int) -> Rates | None:
    try:
        import pykka
    except ImportError:
        return None

    class Sink(pykka.ThreadingActor):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def on_receive(self, message: object) -> int:
            self.count += 1
            return self.count

    ref = Sink.start()
    clock = Clock()
    for i in range(n):
        ref.tell(i)
    ref.ask("last")  # queued behind every tell: returns when all were handled
    rates = clock.rates(n)
    ref.stop()
    return rates


def pykka_ask(n: int) -> Rates | None:
    try:
        import pykka
    except ImportError:
        return None

    class Echoer(pykka.ThreadingActor):
        def on_receive(self, message: object) -> object:
            return message

    ref = Echoer.start()
    clock = Clock()
    for i in range(n):
        ref.ask(i)
    rates = clock.rates(n)
    ref.stop()
    return rates
