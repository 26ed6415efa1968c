"""Round trips for `deepserve bench transport`: actor asks over the ZeroMQ transport
against a raw DEALER/ROUTER echo, in the same run and the same process layout.

- raw: the parent's DEALER sends a request and blocks in `recv` for the answer (the
  natural pyzmq loop); a child process's ROUTER answers in a blocking loop. Both
  sides encode and decode each message (`wire_encode`/`wire_decode`).
- raw asyncio: the same echo written on pyzmq's asyncio sockets (`zmq.asyncio`): the
  parent's DEALER awaits each answer on this process's event loop (uvloop, as the
  driver's), a child's ROUTER answers from its own loop. What a hand-written async
  service does, and the kind of echo issue 7's measured baseline (4.6K round trips/s,
  p50 198 µs) matches on this machine; the blocking loop above is the stricter one.
- ours: an `AsyncDriver` in the parent whose actor `c/0` asks `e/0`, an actor in a
  child process's `AsyncDriver`, then asks again when the answer arrives; both
  drivers talk through `ZmqTransport` with its acks and flow control on.

The children start once; the sides then run `rounds` segments each, interleaved
(raw, raw asyncio, ours, raw, ...), so a change in the machine's load hits them
alike; the rows are the medians of the segments."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

import anyio
import zmq

from deepserve.core import Actor, AskFailed, AsyncDriver, Context, Message, ReplyHandle
from deepserve.core.asyncdriver import run as run_async
from deepserve.core.envelope import Envelope
from deepserve.core.transport import wire_decode, wire_encode

ASK_TIMEOUT_S = 10.0
CHILD_TIMEOUT_S = 60.0
WARMUP = 200  # round trips before each side's first segment (connections, caches)


class RtPing(Message, frozen=True):
    n: int
    text: str = "tok"


class RtRun(Message, frozen=True):
    n: int


class RtDone(Message, frozen=True):
    rtts_us: list[float]
    failed: str = ""


def _env(src: str, dst: str, n: int) -> Envelope:
    # The raw side's message: the same type and sizes as the actors' asks.
    return Envelope(src, dst, n + 1, n, None, RtPing(n))


class Echo(Actor[None]):
    """`e/0`: answers every ask with the same kind of message."""

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, RtPing):
            ctx.reply(RtPing(msg.n))


class Asker(Actor[None]):
    """`c/0`: on `RtRun(n)`, asks `e/0` n times, one after the other, and answers the
    run with each round trip's latency. The latencies are the benchmark's
    instrument, kept on the instance (not actor state: nothing is recorded)."""

    def __init__(self) -> None:
        self.left = 0
        self.run: ReplyHandle | None = None
        self.asked_s = 0.0
        self.rtts_us: list[float] = []

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, RtRun):
            self.left, self.run, self.rtts_us = msg.n, ctx.reply_handle(), []
            self._ask(ctx)
        elif isinstance(msg, RtPing):
            self.rtts_us.append((ctx.now() - self.asked_s) * 1e6)
            self.left -= 1
            if self.left > 0:
                self._ask(ctx)
            else:
                ctx.reply(RtDone(self.rtts_us), to=self.run)
        elif isinstance(msg, AskFailed):
            ctx.reply(RtDone(self.rtts_us, msg.reason), to=self.run)

    def _ask(self, ctx: Context) -> None:
        self.asked_s = ctx.now()
        ctx.ask("e/0", RtPing(self.left), ASK_TIMEOUT_S)


# ---- children (python -m deepserve.benchmarks.transport ROLE ...) ------------------
def raw_echo(endpoint: str) -> None:
    """A ROUTER answering each request in a blocking loop until `stop`."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    print("ready", flush=True)
    while True:
        ident, data = router.recv_multipart()
        if data == b"stop":
            break
        env = wire_decode(data)
        router.send_multipart([ident, wire_encode(_env(env.dst, env.src, env.msg.n))])
    router.close(linger=0)
    ctx.term()


async def asyncio_echo(endpoint: str) -> None:
    """`raw_echo` on pyzmq's asyncio sockets, until `stop`."""
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    print("ready", flush=True)
    while True:
        ident, data = await router.recv_multipart()
        if data == b"stop":
            break
        env = wire_decode(data)
        await router.send_multipart([ident, wire_encode(_env(env.dst, env.src, env.msg.n))])
    router.close(linger=0)
    ctx.term()


async def actor_echo(endpoint: str, reply_to: str) -> None:
    """`e/0` in its own driver, until stdin closes."""
    from deepserve.adapters.zmq import ZmqTransport

    transport = ZmqTransport(bind=endpoint, routes={"c/": reply_to})
    async with AsyncDriver(transport=transport) as d:
        d.spawn("e/0", Echo)
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


def _child(*args: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-m", "deepserve.benchmarks.transport", *args],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if child.stdout is None or child.stdout.readline().strip() != "ready":
        child.kill()
        raise RuntimeError(f"benchmark child {args[0]} did not start")
    return child


# ---- the parent ---------------------------------------------------------------------
class _Raw:
    def __init__(self, tmp: str) -> None:
        endpoint = f"ipc://{tmp}/raw-echo.ipc"
        self.child = _child("raw-echo", endpoint)
        self.ctx = zmq.Context()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.connect(endpoint)

    def segment(self, n: int) -> list[float]:
        """n round trips; each one's latency in microseconds."""
        dealer, clock, rtts_us = self.dealer, time.perf_counter, []
        for i in range(n):
            t0 = clock()
            dealer.send(wire_encode(_env("c/0", "e/0", i)))
            wire_decode(dealer.recv())
            rtts_us.append((clock() - t0) * 1e6)
        return rtts_us

    def close(self) -> None:
        self.dealer.send(b"stop")
        self.child.wait(CHILD_TIMEOUT_S)
        self.dealer.close(linger=0)
        self.ctx.term()


class _AsyncioRaw:
    """The parent's side of the asyncio echo: a `zmq.asyncio` DEALER on this loop."""

    def __init__(self, tmp: str) -> None:
        import zmq.asyncio

        endpoint = f"ipc://{tmp}/asyncio-echo.ipc"
        self.child = _child("asyncio-echo", endpoint)
        self.ctx = zmq.asyncio.Context()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.connect(endpoint)

    async def segment(self, n: int) -> list[float]:
        dealer, clock, rtts_us = self.dealer, time.perf_counter, []
        for i in range(n):
            t0 = clock()
            await dealer.send(wire_encode(_env("c/0", "e/0", i)))
            wire_decode(await dealer.recv())
            rtts_us.append((clock() - t0) * 1e6)
        return rtts_us

    async def close(self) -> None:
        await self.dealer.send(b"stop")
        self.child.wait(CHILD_TIMEOUT_S)
        self.dealer.close(linger=0)
        self.ctx.term()


async def _segment(d: AsyncDriver, n: int) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    done = await d.ask("c/0", RtRun(n), ASK_TIMEOUT_S + n * 0.01)
    elapsed_s = time.perf_counter() - t0
    if not isinstance(done, RtDone) or done.failed or len(done.rtts_us) != n:
        raise RuntimeError(f"round-trip benchmark: asks failed ({getattr(done, 'failed', done)!r})")
    return n / elapsed_s, done.rtts_us


async def _interleaved(tmp: str, n: int, rounds: int) -> dict[str, Any]:
    from deepserve.adapters.zmq import ZmqTransport

    echo_ep = f"ipc://{tmp}/actor-echo.ipc"
    transport = ZmqTransport(bind=f"ipc://{tmp}/actor-client.ipc", routes={"e/": echo_ep})
    echo = _child("actor-echo", echo_ep, transport.endpoint or "")
    raw, araw = _Raw(tmp), _AsyncioRaw(tmp)
    out: dict[str, Any] = {k: [] for k in ("raw_rate", "raw_p50", "araw_rate", "araw_p50", "our_rate", "our_p50")}
    try:
        async with AsyncDriver(transport=transport) as d:
            d.spawn("c/0", Asker)
            raw.segment(WARMUP)
            await araw.segment(WARMUP)
            await _segment(d, WARMUP)
            for _ in range(rounds):
                # The raw client blocks this loop; let the transport's acks leave first.
                await asyncio.sleep(2 * transport.limits.ack_delay_s)
                t0 = time.perf_counter()
                rtts = raw.segment(n)
                out["raw_rate"].append(n / (time.perf_counter() - t0))
                out["raw_p50"].append(statistics.median(rtts))
                t0 = time.perf_counter()
                rtts = await araw.segment(n)
                out["araw_rate"].append(n / (time.perf_counter() - t0))
                out["araw_p50"].append(statistics.median(rtts))
                rate, rtts = await _segment(d, n)
                out["our_rate"].append(rate)
                out["our_p50"].append(statistics.median(rtts))
    finally:
        raw.close()
        await araw.close()
        if echo.stdin is not None:
            echo.stdin.close()
        echo.wait(CHILD_TIMEOUT_S)
    return out


def round_trips(tmp: str, n: int, rounds: int) -> dict[str, float]:
    """Medians over `rounds` interleaved segments of n round trips each."""
    out = run_async(_interleaved, tmp, n, rounds)
    return {k: statistics.median(v) for k, v in out.items()}
