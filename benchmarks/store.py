"""`measure_store`: event-store throughput, with its raw-SQLite baseline measured in the
same run (for `deepserve bench`).

The steps come from a real `SimDriver` run (tokens circulating in a ring of actors:
each delivery is one input, one event and one output, plus periodic snapshots), built
before any clock starts. Records = input + event + output rows.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from typing import Any

import msgspec
from msgspec.structs import astuple

from deepserve.core.actor import Actor
from deepserve.core.context import Context
from deepserve.core.messages import Event, Message
from deepserve.core.records import MemorySink, RunRec, Step
from deepserve.core.sim import SimDriver
from deepserve.persistence import open_log, open_sink
from deepserve.persistence.rows import STEP_TABLES, rows_of, run_row, step_rows
from deepserve.persistence.schema import INSERT_COLUMNS
from deepserve.persistence.sqlite.batch_store import insert_sql
from deepserve.persistence.sqlite.files import prepare_sqlite
from deepserve.persistence.target import parse_target


class LogBenchToken(Message, frozen=True):
    hops: int
    note: str


class LogBenchPassed(Event, frozen=True):
    hops: int


class RingState(msgspec.Struct):
    passed: int = 0


class RingActor(Actor[RingState]):
    snapshot_every = 256

    def __init__(self, next_addr: str) -> None:
        self.next_addr = next_addr

    def initial_state(self) -> RingState:
        return RingState()

    def evolve(self, state: RingState, event: Event) -> RingState:
        return RingState(state.passed + 1)

    def handle(self, ctx: Context, msg: LogBenchToken) -> None:  # type: ignore[override]
        ctx.record(LogBenchPassed(hops=msg.hops))
        ctx.send(self.next_addr, LogBenchToken(hops=msg.hops + 1, note=msg.note))


def ring_steps(n_steps: int, actors: int = 8, tokens: int = 16) -> tuple[RunRec, list[Step]]:
    """`n_steps` steps of a deterministic ring run (the first few are the spawns)."""
    sink = MemorySink()
    sim = SimDriver(seed=7, sink=sink, run_id="bench")
    for i in range(actors):
        sim.spawn(f"ring/{i}", RingActor, next_addr=f"ring/{(i + 1) % actors}")
    for k in range(tokens):
        sim.inject(
            f"ring/{k % actors}", LogBenchToken(hops=0, note=f"token-{k:04d}"), corr=f"req-{k}"
        )
    sim.run(max_deliveries=n_steps)
    return sink.runs[0], sink.steps


def count_records(steps: list[Step]) -> int:
    return sum(1 + len(s.events) + len(s.outputs) for s in steps)


def _time_sink(target: str, durability: str, run: RunRec, steps: list[Step]) -> float:
    sink = open_sink(target, durability)  # type: ignore[arg-type]
    commits: list[int] = []
    sink.on_commit = commits.append
    t0 = time.perf_counter()
    sink.begin_run(run)
    for step in steps:
        sink.append(step)
    sink.close()
    return time.perf_counter() - t0


def _time_raw(path: str, run: RunRec, steps: list[Step]) -> float:
    """The same rows, pre-built, into the same schema: one executemany per table."""
    prepare_sqlite(path, create=True, upgrade=True)
    flat = step_rows(map(astuple, steps), run.run_id, range(1, len(steps) + 1), astuple)
    rows = {"runs": [tuple(run_row(astuple(run)))]}
    rows.update({t: rows_of(f, len(INSERT_COLUMNS[t])) for t, f in zip(STEP_TABLES, flat, strict=True)})
    sql = insert_sql()
    t0 = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA cache_size=-65536")  # as the writer's connection
    conn.execute("BEGIN")
    for name, data in rows.items():
        if data:
            conn.executemany(sql[name], data)
    conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - t0


def _time_read(target: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    log = open_log(target)
    n = sum(1 + len(s.events) + len(s.outputs) for s in log.steps())
    log.close()
    return time.perf_counter() - t0, n


def measure_store(n_steps: int, target: str, rounds: int = 1) -> dict[str, Any]:
    """Records/s for group commit (async and outbox), a raw sqlite3 executemany of the
    same rows, and streaming reads; each the best of `rounds` interleaved runs (async,
    outbox, raw, read, async, ...). `target`: a directory for the SQLite files (created
    if missing; the files are removed afterwards), or a PostgreSQL URL (then each mode
    appends one more run to that database and there is no raw baseline)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    run, steps = ring_steps(n_steps)
    records = count_records(steps)
    out: dict[str, Any] = {"steps": len(steps), "records": records}

    def keep(key: str, rate: float) -> None:
        out[key] = max(out.get(key, 0.0), rate)

    if parse_target(target).kind == "postgresql":
        out["backend"] = "postgresql"
        for _ in range(rounds):
            for mode in ("async", "outbox"):
                r = msgspec.structs.replace(run, run_id=f"bench-{mode}-{time.time_ns()}")
                keep(f"{mode}_rps", records / _time_sink(target, mode, r, steps))
        return out
    made = not os.path.exists(target)
    base = target
    os.makedirs(base, exist_ok=True)
    try:
        out["backend"] = "sqlite"
        for _ in range(rounds):
            _remove_files(base)
            for mode in ("async", "outbox"):
                keep(f"{mode}_rps", records / _time_sink(
                    os.path.join(base, f"{mode}.db"), mode, run, steps
                ))
            keep("raw_rps", records / _time_raw(os.path.join(base, "raw.db"), run, steps))
            seconds, n = _time_read(os.path.join(base, "async.db"))
            keep("read_rps", n / seconds)
        out["async_vs_raw"] = out["async_rps"] / out["raw_rps"]
        out["outbox_vs_raw"] = out["outbox_rps"] / out["raw_rps"]
    finally:
        _remove_files(base)
        if made:
            shutil.rmtree(base, ignore_errors=True)
    return out


def _remove_files(base: str) -> None:
    for name in ("async.db", "outbox.db", "raw.db"):
        for suffix in ("", "-wal", "-shm"):
            p = os.path.join(base, name + suffix)
            if os.path.exists(p):
                os.remove(p)
