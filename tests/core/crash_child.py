"""Child process for the crash-durability test: an AsyncDriver with `outbox`
durability streaming messages over ZeroMQ to another process, until killed."""

from __future__ import annotations

import sys

import anyio

from deepserve.adapters.zmq_transport import ZmqTransport
from deepserve.core import Actor, Context, Message
from deepserve.core.asyncdriver import AsyncDriver, run
from deepserve.persistence import open_sink


class Emit(Message, frozen=True):
    n: int


class CrashGo(Message, frozen=True):
    n: int


class Producer(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, CrashGo):
            for i in range(20):
                ctx.send("rx/0", Emit(msg.n * 20 + i))
            ctx.after(0.001, CrashGo(msg.n + 1))


async def main(log: str, endpoint: str, durability: str) -> None:
    sink = open_sink(log, durability=durability)
    transport = ZmqTransport(bind=None, routes={"rx/": endpoint})
    async with AsyncDriver(sink=sink, outbox=durability == "outbox", transport=transport) as d:
        d.spawn("p/0", Producer)
        d.inject_nowait("p/0", CrashGo(0))
        print("started", flush=True)
        await anyio.sleep(3600)


if __name__ == "__main__":
    run(main, *sys.argv[1:4])
