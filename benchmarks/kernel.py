"""`deepserve bench kernel`: the kernel's throughput, each row beside a baseline
measured in the same run on the same machine."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from deepserve.benchmarks import kernel_workloads as w
from deepserve.benchmarks.table import Row
from deepserve.core.asyncdriver import run as run_async

Progress = Callable[[str], None]


def _loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


ROUNDS = 3  # every row and its baseline: best of this many interleaved runs

Measure = Callable[[], "float | w.Rates | None"]


def best_of(rounds: int, runs: dict[str, Measure]) -> dict[str, Any]:
    """Each workload `rounds` times, interleaved (a, b, c, a, b, c, ...), keeping
    each one's best rate (for (wall, CPU) rates, the best of each): on a shared
    machine a row and its baseline then see the same spells of contention, and one
    run gives steady ratios."""
    best: dict[str, Any] = dict.fromkeys(runs)
    for _ in range(rounds):
        for name, fn in runs.items():
            rate, old = fn(), best[name]
            if rate is None:
                continue
            if old is None:
                best[name] = rate
            elif isinstance(rate, tuple):
                best[name] = (max(old[0], rate[0]), max(old[1], rate[1]))
            else:
                best[name] = max(old, rate)
    return best


def _logged_pingpong(n: int, tmp: str) -> w.Rates:
    """Logged end to end: from the first delivery until the log is closed (every
    step committed, the writer process gone and its indexes built), into a fresh
    file each run. Its CPU counts the writer process's too."""
    from deepserve.persistence import open_sink

    path = os.path.join(tmp, "sim.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    sink = open_sink(path, durability="async", writer="process")
    return w.sim_pingpong(n, sink)


def sim_rows(scale: float, tmp: str, rounds: int = ROUNDS) -> list[Row]:
    n = int(300_000 * scale)
    best = best_of(rounds, {
        "floor": lambda: w.heapq_loop(n),
        "nolog": lambda: w.sim_pingpong(n),
        "logged": lambda: _logged_pingpong(n, tmp),
    })
    floor, (nolog, nolog_cpu), (logged, logged_cpu) = best["floor"], best["nolog"], best["logged"]
    return [
        Row("sim_deliveries_per_s_nolog", nolog, "deliveries/s", "bare_heapq_loop_per_s", floor),
        Row("sim_deliveries_per_s_logged", logged, "deliveries/s", "sim_deliveries_per_s_nolog", nolog),
        Row("sim_deliveries_per_cpu_s_logged", logged_cpu, "deliveries/s",
            "sim_deliveries_per_cpu_s_nolog", nolog_cpu),
    ]


@contextlib.contextmanager
def one_cpu() -> Iterator[str]:
    """Pin this thread (and the threads it starts: Pykka's actors) to one CPU, then restore.
    Pykka's threads hand a message over several times faster on one core than across two
    (measured here: ask ~42k/s pinned against ~15k/s spread; which one a run got depended on
    the scheduler's placement, so the comparison flipped between runs). Pinned, Pykka is at
    its fastest and steady."""
    getaff = getattr(os, "sched_getaffinity", None)
    setaff = getattr(os, "sched_setaffinity", None)
    if getaff is None or setaff is None:
        yield "not pinned (no sched_setaffinity here)"
        return
    old = getaff(0)
    cpu = min(old)
    setaff(0, {cpu})
    try:
        yield f"pinned to CPU {cpu}"
    finally:
        setaff(0, old)


def _pinned(fn: Callable[[], Any]) -> Any:
    with one_cpu():
        return fn()


def async_rows(scale: float, rounds: int = ROUNDS) -> list[Row]:
    n = int(300_000 * scale)
    loop = _loop_name()
    # Each side at its fastest placement: Pykka's two threads on one CPU (`one_cpu`), the
    # AsyncDriver (one thread) where the scheduler puts it (pinned it ran ~10% slower here).
    best = best_of(rounds, {
        "stream": lambda: run_async(w._async_stream, n // w.Streamer.batch),
        "queue": lambda: run_async(w._queue_stream, n),
        "pykka_tell": lambda: _pinned(lambda: w.pykka_tell(int(100_000 * scale))),
        "asks": lambda: run_async(w._async_asks, int(80_000 * scale)),
        "futures": lambda: run_async(w._future_roundtrips, int(100_000 * scale)),
        "pykka_ask": lambda: _pinned(lambda: w.pykka_ask(int(10_000 * scale))),
    })
    (stream, stream_cpu), (rts, rts_cpu) = best["stream"], best["asks"]
    rows = [
        Row("async_msgs_per_s", stream, "msgs/s", f"asyncio_queue_msgs_per_s ({loop})", best["queue"]),
        Row("async_roundtrips_per_s", rts, "round trips/s", f"future_roundtrips_per_s ({loop})",
            best["futures"]),
    ]
    tell, ask = best["pykka_tell"], best["pykka_ask"]
    if tell is not None and ask is not None:
        rows += [
            Row("async_msgs_per_s_vs_pykka", stream, "msgs/s", "pykka_tell_msgs_per_s", tell[0]),
            Row("async_roundtrips_per_s_vs_pykka", rts, "round trips/s", "pykka_ask_per_s", ask[0]),
            Row("async_msgs_per_cpu_s_vs_pykka", stream_cpu, "msgs/s",
                "pykka_tell_msgs_per_cpu_s", tell[1]),
            Row("async_roundtrips_per_cpu_s_vs_pykka", rts_cpu, "round trips/s",
                "pykka_ask_per_cpu_s", ask[1]),
        ]
    return rows


def store_rows(scale: float, tmp: str, pg_url: str | None, rounds: int = ROUNDS) -> list[Row]:
    from deepserve.benchmarks.store import measure_store

    n = int(60_000 * scale)
    m = measure_store(n, os.path.join(tmp, "store"), rounds)
    raw = m["raw_rps"]
    rows = [
        Row("store_records_per_s_sqlite", m["async_rps"], "records/s",
            "raw_sqlite_executemany_records_per_s", raw),
        Row("store_records_per_s_outbox", m["outbox_rps"], "records/s",
            "raw_sqlite_executemany_records_per_s", raw),
        Row("store_read_records_per_s_sqlite", m["read_rps"], "records/s",
            "store_records_per_s_sqlite", m["async_rps"]),
    ]
    if pg_url:
        p = measure_store(n, pg_url, rounds)
        rows.append(Row("store_records_per_s_postgres", p["async_rps"], "records/s",
                        "store_records_per_s_sqlite", m["async_rps"]))
    return rows


def replay_rows(scale: float, tmp: str, rounds: int = ROUNDS) -> list[Row]:
    """Verify re-executes every input; the baseline is executing them the first time."""
    from deepserve.benchmarks.replay_workload import build_log
    from deepserve.persistence import MemoryLog, open_log, open_sink
    from deepserve.replay.verifier import verify

    n = int(200_000 * scale)
    built: list[Any] = []

    def forward() -> float:
        t0 = time.perf_counter()
        sink = build_log(n)
        rate = len(sink.steps) / (time.perf_counter() - t0)
        built[:] = [sink]
        return rate

    def verify_rate(log: Any) -> float:
        t0 = time.perf_counter()
        result = verify(log)
        rate = result.inputs / (time.perf_counter() - t0)
        if not result.identical:
            raise RuntimeError(f"replay benchmark: {result.summary()}")
        return rate

    mem = best_of(rounds, {"forward": forward, "verify": lambda: verify_rate(MemoryLog(built[0]))})
    sink = built[0]
    path = os.path.join(tmp, "replay.db")
    with open_sink(path) as disk:
        for run in sink.runs:
            disk.begin_run(run)
        for step in sink.steps:
            disk.append(step)
    log = open_log(path)

    def read_rate() -> float:
        t0 = time.perf_counter()
        return sum(1 for _ in log.steps()) / (time.perf_counter() - t0)

    try:
        disk_rates = best_of(rounds, {"verify": lambda: verify_rate(log), "read": read_rate})
    finally:
        log.close()
    return [
        Row("replay_inputs_per_s", mem["verify"], "inputs/s",  # type: ignore[arg-type]
            "sim_deliveries_per_s_memory_log (same workload)", mem["forward"]),
        Row("replay_inputs_per_s_sqlite", disk_rates["verify"], "inputs/s",  # type: ignore[arg-type]
            "store_read_steps_per_s (same file)", disk_rates["read"]),
    ]


def kernel_bench(scale: float = 1.0, pg_url: str | None = None,
                 progress: Progress | None = None, rounds: int = ROUNDS) -> tuple[str, list[Row]]:
    """All rows; `scale` shrinks or grows every workload (tests use a small one).
    Every row and its baseline are the best of `rounds` interleaved runs."""
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale!r}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="deepserve-bench-") as tmp:
        for label, fn in (
            ("SimDriver", lambda: sim_rows(scale, tmp, rounds)),
            ("AsyncDriver", lambda: async_rows(scale, rounds)),
            ("event store", lambda: store_rows(scale, tmp, pg_url, rounds)),
            ("replay verify", lambda: replay_rows(scale, tmp, rounds)),
        ):
            if progress is not None:
                progress(label)
            rows.extend(fn())
    title = (
        f"deepserve bench kernel (AsyncDriver loop: {_loop_name()}, {os.cpu_count()} cores; Pykka pinned to "
        "one CPU, its fastest placement; "
        f"each row and its baseline: best of {rounds} interleaved runs; *_per_cpu_s rows: per "
        "second of CPU time, all threads and the log writer process included)"
    )
    return title, rows
