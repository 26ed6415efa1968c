"""`deepserve bench kernel`: the kernel's throughput, each row beside a baseline
measured in the same run on the same machine."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable

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


def sim_rows(scale: float, tmp: str) -> list[Row]:
    from deepserve.persistence import open_sink

    n = int(300_000 * scale)
    floor = w.heapq_loop(n)
    nolog = w.sim_pingpong(n)
    sink = open_sink(os.path.join(tmp, "sim.db"), durability="async", writer="process")
    logged = w.sim_pingpong(n, sink)
    sink.close()
    return [
        Row("sim_deliveries_per_s_nolog", nolog, "deliveries/s", "bare_heapq_loop_per_s", floor),
        Row("sim_deliveries_per_s_logged", logged, "deliveries/s", "sim_deliveries_per_s_nolog", nolog),
    ]


def async_rows(scale: float) -> list[Row]:
    n = int(300_000 * scale)
    loop = _loop_name()
    stream = run_async(w._async_stream, n // w.Streamer.batch)
    queue = run_async(w._queue_stream, n)
    rts = run_async(w._async_asks, int(80_000 * scale))
    futs = run_async(w._future_roundtrips, int(100_000 * scale))
    rows = [
        Row("async_msgs_per_s", stream, "msgs/s", f"asyncio_queue_msgs_per_s ({loop})", queue),
        Row("async_roundtrips_per_s", rts, "round trips/s", f"future_roundtrips_per_s ({loop})", futs),
    ]
    tell = w.pykka_tell(int(100_000 * scale))
    ask = w.pykka_ask(int(10_000 * scale))
    if tell is not None and ask is not None:
        rows.append(Row("async_msgs_per_s_vs_pykka", stream, "msgs/s", "pykka_tell_msgs_per_s", tell))
        rows.append(
            Row("async_roundtrips_per_s_vs_pykka", rts, "round trips/s", "pykka_ask_per_s", ask)
        )
    return rows


def store_rows(scale: float, tmp: str, pg_url: str | None) -> list[Row]:
    from deepserve.benchmarks.store import measure_store

    n = int(60_000 * scale)
    m = measure_store(n, os.path.join(tmp, "store"))
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
        p = measure_store(n, pg_url)
        rows.append(Row("store_records_per_s_postgres", p["async_rps"], "records/s",
                        "store_records_per_s_sqlite", m["async_rps"]))
    return rows


def replay_rows(scale: float, tmp: str) -> list[Row]:
    """Verify re-executes every input; the baseline is executing them the first time."""
    from deepserve.benchmarks.replay_workload import build_log
    from deepserve.persistence import MemoryLog, open_log, open_sink
    from deepserve.replay.verify import verify

    n = int(200_000 * scale)
    t0 = time.perf_counter()
    sink = build_log(n)
    forward = len(sink.steps) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    result = verify(MemoryLog(sink))
    in_memory = result.inputs / (time.perf_counter() - t0)
    assert result.identical, result.summary()
    path = os.path.join(tmp, "replay.db")
    with open_sink(path) as disk:
        for run in sink.runs:
            disk.begin_run(run)
        for step in sink.steps:
            disk.append(step)
    log = open_log(path)
    t0 = time.perf_counter()
    result = verify(log)
    from_sqlite = result.inputs / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    read = sum(1 for _ in log.steps()) / (time.perf_counter() - t0)
    log.close()
    assert result.identical, result.summary()
    return [
        Row("replay_inputs_per_s", in_memory, "inputs/s",
            "sim_deliveries_per_s_memory_log (same workload)", forward),
        Row("replay_inputs_per_s_sqlite", from_sqlite, "inputs/s",
            "store_read_steps_per_s (same file)", read),
    ]


def kernel_bench(scale: float = 1.0, pg_url: str | None = None,
                 progress: Progress | None = None) -> tuple[str, list[Row]]:
    """All rows; `scale` shrinks or grows every workload (tests use a small one)."""
    assert scale > 0
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="deepserve-bench-") as tmp:
        for label, fn in (
            ("SimDriver", lambda: sim_rows(scale, tmp)),
            ("AsyncDriver", lambda: async_rows(scale)),
            ("event store", lambda: store_rows(scale, tmp, pg_url)),
            ("replay verify", lambda: replay_rows(scale, tmp)),
        ):
            if progress is not None:
                progress(label)
            rows.extend(fn())
    title = f"deepserve bench kernel (AsyncDriver loop: {_loop_name()}, {os.cpu_count()} cores)"
    return title, rows
