"""Throughput of `verify`, on a synthetic but representative log.

The workload is a ring of relays passing tokens: every delivery decodes a
message, draws from the rng, records one event and sends one message — the
shape of a typical control-plane actor step, with little handler work so the
number measures the replay machinery itself.
"""

from __future__ import annotations

import time

import msgspec

from deepserve.core.actor import Actor
from deepserve.core.messages import Event, Message
from deepserve.core.records import MemorySink
from deepserve.core.sim import SimDriver
from deepserve.persistence import MemoryLog
from deepserve.replay.verifier import verify


class BenchToken(Message, frozen=True):
    hops: int
    ring: int


class BenchPassed(Event, frozen=True):
    hops: int
    draw: float


class RelayState(msgspec.Struct):
    passed: int = 0
    total: float = 0.0


class BenchRelay(Actor[RelayState]):
    def __init__(self, nxt: str, draw: bool = True) -> None:
        self.nxt = nxt
        self.draw = draw

    def initial_state(self) -> RelayState:
        return RelayState()

    def evolve(self, state: RelayState, event: Event) -> RelayState:
        assert isinstance(event, BenchPassed)
        state.passed += 1
        state.total += event.draw
        return state

    def handle(self, ctx, msg) -> None:  # type: ignore[no-untyped-def]
        assert isinstance(msg, BenchToken)
        ctx.record(BenchPassed(hops=msg.hops, draw=ctx.rng.random() if self.draw else 0.0))
        if msg.hops > 0:
            ctx.send(self.nxt, BenchToken(hops=msg.hops - 1, ring=msg.ring))


def build_log(
    n: int, ring: int = 16, tokens: int = 8, seed: int = 7, rng: bool = True
) -> MemorySink:
    """A log of about `n` deliveries (`ring` relays, `tokens` concurrent tokens);
    `rng`: every delivery draws from `ctx.rng` (seeding it costs ~4.5 us)."""
    sink = MemorySink()
    driver = SimDriver(seed, sink=sink)
    for i in range(ring):
        driver.spawn(f"relay/{i}", BenchRelay, nxt=f"relay/{(i + 1) % ring}", draw=rng)
    hops = max(1, (n - ring) // tokens - 1)
    for k in range(tokens):
        driver.inject(f"relay/{k % ring}", BenchToken(hops=hops, ring=k), at=0.001 * k, corr=f"tok-{k}")
    driver.run()
    return sink


def measure_verify(n: int = 200_000, rng: bool = True) -> dict[str, float]:
    """Verify an in-memory log of about `n` inputs (so the store's read speed is
    not part of it); returns inputs, seconds and inputs/s. `rng=False`: handlers
    do not draw random numbers, which isolates the replay machinery."""
    log = MemoryLog(build_log(n, rng=rng))
    t0 = time.perf_counter()
    result = verify(log)
    seconds = time.perf_counter() - t0
    if not result.identical:
        raise AssertionError(f"benchmark log does not verify: {result.summary()}")
    return {
        "inputs": float(result.inputs),
        "seconds": seconds,
        "inputs_per_s": result.inputs / seconds if seconds > 0 else float("inf"),
    }
