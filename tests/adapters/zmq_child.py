"""Child processes for the ZeroMQ transport tests.

    receiver ENDPOINT SLOW_US CAPACITY  binds ENDPOINT, counts `ZcItem`s at rx/0 (each
                                        handler busy for SLOW_US), prints "ready",
                                        and a JSON summary when stdin closes
    sender ENDPOINT N                   sends N `ZcItem`s to rx/0 from an actor, then
                                        exits at once and prints a JSON summary
"""

from __future__ import annotations

import json
import sys
import time

import anyio
import msgspec

from deepserve.adapters.zmq import ZmqTransport
from deepserve.core import Actor, Context, Event, Message
from deepserve.core.asyncdriver import AsyncDriver, run

CHUNK = 100  # sends per handler: the driver may make the producer wait between chunks


class ZcItem(Message, frozen=True):
    n: int


class ZcBurst(Message, frozen=True):
    start: int
    left: int


class ZcGot(Event, frozen=True):
    n: int


class Seen(msgspec.Struct, frozen=True):
    count: int = 0
    total: int = 0


class Sink(Actor[Seen]):
    slow_s = 0.0

    def initial_state(self) -> Seen:
        return Seen()

    def evolve(self, state: Seen, event: Event) -> Seen:
        assert isinstance(event, ZcGot)
        return Seen(state.count + 1, state.total + event.n)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, ZcItem):
            until = time.perf_counter() + self.slow_s
            while time.perf_counter() < until:  # a slow consumer, on purpose
                pass
            ctx.record(ZcGot(msg.n))


class Producer(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, ZcBurst):
            n = min(CHUNK, msg.left)
            for i in range(msg.start, msg.start + n):
                ctx.send("rx/0", ZcItem(i))
            if msg.left > n:
                ctx.send(ctx.self, ZcBurst(msg.start + n, msg.left - n))


async def receiver(endpoint: str, slow_us: int, capacity: int) -> None:
    Sink.slow_s = slow_us / 1e6
    transport = ZmqTransport(bind=endpoint)
    async with AsyncDriver(transport=transport, mailbox_capacity=capacity) as d:
        d.spawn("rx/0", Sink)
        print("ready", transport.endpoint, flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes stdin
        await d.idle()
        seen = d.actor("rx/0").state
        summary = {"count": seen.count, "total": seen.total, "received": transport.received,
                   "duplicates": transport.duplicates, "full": d.mailbox_full}
    print(json.dumps(summary), flush=True)


async def sender(endpoint: str, n: int) -> None:
    transport = ZmqTransport(routes={"rx/": endpoint})
    async with AsyncDriver(transport=transport) as d:
        d.spawn("tx/0", Producer)
        await d.inject("tx/0", ZcBurst(0, n))
        await d.idle()  # every ZcItem handed to the transport; exit at once
    print(json.dumps({"sent": transport.sent, "refused": transport.refused,
                      "dead_letters": d.dead_letters}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "receiver":
        run(receiver, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        run(sender, sys.argv[2], int(sys.argv[3]))
