"""Log data for the persistence tests: a tiny actor network run by the real SimDriver,
plus hand-built steps for the edges of the record types."""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.core import Actor, Context, Event, Message, SimDriver
from deepserve.core.records import (
    DEAD,
    DELIVERED,
    EventRec,
    InputRec,
    LogSink,
    MemorySink,
    OutputRec,
    RunRec,
    SnapshotRec,
    Step,
)


class StoreBump(Message, frozen=True):
    n: int
    note: str = ""


class StoreNote(Message, frozen=True):
    text: str


class StoreBumped(Event, frozen=True):
    n: int


class StoreNoted(Event, frozen=True):
    text: str


class CounterState(msgspec.Struct):
    total: int = 0


class StoreCounter(Actor[CounterState]):
    snapshot_every = 4  # plenty of snapshots in a short run

    def __init__(self, logger: str) -> None:
        self.logger = logger

    def initial_state(self) -> CounterState:
        return CounterState()

    def evolve(self, state: CounterState, event: Event) -> CounterState:
        return CounterState(state.total + event.n)  # type: ignore[attr-defined]

    def handle(self, ctx: Context, msg: Any) -> None:
        if msg.n < 0:
            raise ValueError("negative bump")  # a supervised failure in the log
        ctx.record(StoreBumped(n=msg.n))
        ctx.send(self.logger, StoreNote(text=f"{ctx.self} +{msg.n}"))
        if msg.n % 3 == 0:
            ctx.after(0.25, StoreBump(n=msg.n + 1, note="timer"))


class StoreLogger(Actor[list]):
    def initial_state(self) -> list:
        return []

    def evolve(self, state: list, event: Event) -> list:
        return [*state, event.text]  # type: ignore[attr-defined]

    def handle(self, ctx: Context, msg: Any) -> None:
        ctx.record(StoreNoted(text=msg.text))


def sim_run(
    sink: LogSink, *, seed: int = 1, run_id: str | None = None, requests: int = 12
) -> SimDriver:
    """Two counters and a logger; external bumps at increasing times, each request its
    own correlation id; one dead letter and one handler failure."""
    sim = SimDriver(seed=seed, sink=sink, run_id=run_id)
    sim.spawn("log/0", StoreLogger)
    for i in range(2):
        sim.spawn(f"counter/{i}", StoreCounter, logger="log/0")
    for k in range(requests):
        sim.inject(f"counter/{k % 2}", StoreBump(n=k), at=0.5 * k, corr=f"req-{k}")
    sim.inject("counter/0", StoreBump(n=-1), at=1.0, corr="req-bad")
    sim.inject("nobody/9", StoreNote(text="lost"), at=2.0, corr="req-dead")
    sim.run()
    return sim


def expected(
    seed: int = 1, run_id: str | None = None, requests: int = 12
) -> tuple[RunRec, list[Step]]:
    mem = MemorySink()
    sim_run(mem, seed=seed, run_id=run_id, requests=requests)
    return mem.runs[0], mem.steps


def run_rec(run_id: str, process: str = "main", started_at: float = 1.0) -> RunRec:
    return RunRec(run_id, "daemon", 3, '{"k": [1, 2]}', "0.1.0", "host-a", started_at, process)


def edge_steps() -> list[Step]:
    """Hand-built steps at the edges: nulls, empty and large payloads, big integers,
    unicode, dead letters, every output kind, snapshots."""
    big = bytes(range(256)) * 4096  # 1 MiB, every byte value
    return [
        Step(
            InputRec("a/1", 0, 0.0, 0, DELIVERED, "ext/op", 1, None, None, True, "Started", b""),
            [],
            [],
        ),
        Step(
            InputRec(
                "a/1", 1, 1e-300, 2**62, DELIVERED, "b/2", 2**53 + 1, "c-ü", 7, False, "Ping", big
            ),
            [EventRec("a/1", 1, 0, "Evt", b"\x00"), EventRec("a/1", 1, 1, "Evt2", b"")],
            [
                OutputRec("a/1", 1, 0, 0, "b/2", 3, 0.0, None, "c-ü", 2, True, "Pong", b"\xff"),
                OutputRec("a/1", 1, 1, 1, "a/1", 4, 2.5, "tick", None, None, False, "Tick", b"t"),
                OutputRec("a/1", 1, 2, 2, "a/1", 5, 0.0, "tick", None, None, False, "", b""),
                OutputRec(
                    "a/1", 1, 3, 3, "a/1/child", 6, 0.0, None, None, None, False, "Started", b"s"
                ),
                OutputRec("a/1", 1, 4, 4, "b/2", 7, 0.0, None, None, None, False, "", b""),
            ],
            SnapshotRec("a/1", 1, "mod:State", b"\x81\xa1x\x01"),
        ),
        Step(
            InputRec("gone/1", -1, 3.25, 0, DEAD, "a/1", 3, "c", None, False, "Pong", b"\xff"),
            [],
            [],
        ),
        Step(
            InputRec("数/字", 1, 1e12, -5, DELIVERED, "ext/x", -1, "", 0, True, "Ünïcode", b"u"),
            [],
            [],
        ),
    ]


def encoded(steps: list[Step]) -> bytes:
    return msgspec.msgpack.encode(steps)


def force_reader_process(monkeypatch: Any, lead: int = 2) -> None:
    """Make every unfiltered SQLite `steps()` read all but its first `lead` steps
    through a reader process (normally only runs of 20k steps and more do)."""
    from deepserve.persistence.sqlite import log_reader as sqlite_reader

    monkeypatch.setattr(sqlite_reader, "PREFETCH_MIN_STEPS", 0)
    monkeypatch.setattr(sqlite_reader, "PREFETCH_LEAD", lead)
    monkeypatch.setattr(sqlite_reader, "MAX_READERS", 8)
