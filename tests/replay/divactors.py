"""Actors that break the kernel's rules on purpose, so replay must catch them.

Importable as `divactors` (tests/replay on PYTHONPATH): a log's `Started`
input names the class by module path.
"""

from __future__ import annotations

import time

from deepserve.core import Actor, Context, Event, Message, SimDriver
from deepserve.core.records import LogSink


class DivTick(Message, frozen=True):
    n: int


class DivItem(Message, frozen=True):
    name: str


class DivClock(Event, frozen=True):
    wall: float


class DivCounted(Event, frozen=True):
    n: int


class Counter(Actor[int]):
    """A well-behaved actor, so the log has more than the culprits in it."""

    def initial_state(self) -> int:
        return 0

    def evolve(self, state: int, event: Event) -> int:
        assert isinstance(event, DivCounted)
        return state + event.n

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, DivTick):
            ctx.record(DivCounted(n=msg.n))


class WallClockReader(Actor[float]):
    """Reads the wall clock inside a handler (forbidden: use ctx.now())."""

    def initial_state(self) -> float:
        return 0.0

    def evolve(self, state: float, event: Event) -> float:
        assert isinstance(event, DivClock)
        return event.wall

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, DivTick) and msg.n >= 3:
            ctx.record(DivClock(wall=time.time()))


class SetIterator(Actor[None]):
    """Sends one message per name, in set order (forbidden: hash order differs
    between processes with different PYTHONHASHSEED)."""

    NAMES = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, DivTick) and msg.n >= 2:
            for name in set(self.NAMES):
                ctx.send("counter", DivItem(name=name))


def run(sink: LogSink | None, culprit: str) -> SimDriver:
    """`culprit`: "clock" or "set". The culprit lives at `suspect`; its first
    misbehaving delivery is #4 for the clock reader and #3 for the set iterator
    (#1 is Started, then ticks n=1, 2, 3, ...)."""
    driver = SimDriver(3, sink=sink)
    driver.spawn("counter", Counter)
    driver.spawn("suspect", WallClockReader if culprit == "clock" else SetIterator)
    for n in range(1, 6):
        driver.inject("counter", DivTick(n=n), at=float(n))
        driver.inject("suspect", DivTick(n=n), at=float(n) + 0.5)
    driver.run()
    return driver


def write_log(path: str, culprit: str) -> None:
    from deepserve.persistence import open_sink

    sink = open_sink(path, "async")
    run(sink, culprit)
    sink.close()
