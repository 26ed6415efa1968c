"""`deepserve bench sim`: simulated requests per wall second on a whole trace (issue 10).

The run: the `mooncake-16te` scenario (16 colocated Llama-3-8B TEs on 910B, prefix caching on)
over the full Mooncake conversation trace (12,031 requests) with the event log on (SQLite, the
writer process `deepserve sim` uses), split by server over as many worker processes as this
process may use cores (`deepserve sim --workers N`, deepserve/cluster/parallel.py; the same
per-request results; a split run has its TEs behind the workload dispatcher, no gateway, JE nor
control plane). Baselines, measured in the same invocation: the same run in one process, log on
(what the split buys) and log off (what logging costs). `platform_requests_per_wall_s` is what
`deepserve sim mooncake-16te` runs, the whole platform (gateway, JEs, control plane) in one
process with the log on, against the dispatcher's one-process run. Target (issue 10): ≥ 1,400
simulated requests per wall s. When the full trace is not beside the checkout
(../shared/traces), the built-in 1,000-request slice is used and the title says so. A last run
gives the harness floor (`sim_floor.py`): the same trace through the same loop and workload actor,
log on, with TEs that answer at once.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from deepserve.benchmarks.sim_floor import build_instant
from deepserve.benchmarks.table import Row

FULL_TRACE = "mooncake_conversation.jsonl"
TARGET_REQUESTS_PER_WALL_S = 1400.0


def find_full_trace() -> str | None:
    """$DEEPSERVE_TRACES, else ../shared/traces beside the checkout (as in CI)."""
    here = Path(__file__).resolve().parents[1]
    for folder in (os.environ.get("DEEPSERVE_TRACES"), here.parent / "shared" / "traces"):
        if folder and (Path(folder) / FULL_TRACE).is_file():
            return str(Path(folder) / FULL_TRACE)
    return None


def bench_trace() -> str:
    """The trace the bench runs: the full Mooncake trace if found, else the built-in slice."""
    from deepserve.adapters.scenario.loader import trace_path

    return find_full_trace() or trace_path("builtin:mooncake_conv_1k")


def _one_run(scenario: object, trace: str, requests: int | None, log: str | None,
             build: Callable | None = None) -> tuple[dict, float, float]:  # fmt: skip
    from deepserve.cluster.run import run_scenario
    from deepserve.persistence import open_sink

    sink = open_sink(log, "async", writer="process") if log else None
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        result = run_scenario(scenario, trace=trace, requests=requests, sink=sink, build=build)  # type: ignore[arg-type]
    finally:
        if sink is not None:
            sink.close()
    # CPU time of this process (the simulation; the log writer is its own process): on a loaded
    # machine it says what the run costs when wall time says how long it waited too.
    return result.summary, time.perf_counter() - t0, time.process_time() - c0


def _platform_run(scenario_name: str, overrides: tuple[str, ...], trace: str, requests: int | None,
                  log: str) -> tuple[dict, float]:  # fmt: skip
    """What `deepserve sim SCENARIO` runs in one process: the whole platform (gateway, JEs, control
    plane, TEs; deepserve.cluster), log on."""
    from deepserve.cluster.config import load
    from deepserve.cluster.sim import run
    from deepserve.persistence import open_sink

    cfg = load(scenario_name, overrides, "sim")
    sink = open_sink(log, "async", writer="process")
    t0 = time.perf_counter()
    try:
        result = run(cfg, trace=trace, requests=requests, sink=sink)
    finally:
        sink.close()
    return result.summary, time.perf_counter() - t0


def _split_run(scenario: object, trace: str, requests: int | None, log_dir: str) -> tuple[dict, float, int]:
    from deepserve.adapters.scenario.partition import plan_partitions, worker_log_names
    from deepserve.cluster.parallel import cpu_count, run_parallel

    parts = plan_partitions(scenario, cpu_count())  # type: ignore[arg-type]
    logs = [os.path.join(log_dir, name) for name in worker_log_names(parts)]
    t0 = time.perf_counter()
    result = run_parallel(scenario, parts, trace=trace, requests=requests, logs=logs)  # type: ignore[arg-type]
    return result.summary, time.perf_counter() - t0, len(parts)


def sim_bench(requests: int | None, progress: Callable[[str], None], scenario_name: str = "mooncake-16te",
              overrides: tuple[str, ...] = ()) -> tuple[str, list[Row]]:  # fmt: skip
    from deepserve.adapters.scenario.loader import load_scenario
    from deepserve.adapters.scenario.partition import plan_partitions
    from deepserve.cluster.parallel import cpu_count

    scenario = load_scenario(scenario_name, overrides)
    plan_partitions(scenario, cpu_count())  # a scenario that cannot be split: refused before any run
    trace = bench_trace()
    with tempfile.TemporaryDirectory(prefix="deepserve-bench-sim-") as tmp:
        progress("the run with the log on, split by server over this machine's cores")
        split, wall_split, workers = _split_run(scenario, trace, requests, tmp)
        progress("the same run in one process, log on (baseline)")
        logged, wall_logged, cpu_logged = _one_run(scenario, trace, requests, os.path.join(tmp, "sim.db"))
        progress("the whole platform in one process, log on (what `deepserve sim` runs)")
        platform, wall_platform = _platform_run(scenario_name, overrides, trace, requests,
                                                os.path.join(tmp, "platform.db"))  # fmt: skip
        progress("the same run with the log off (baseline)")
        bare, wall_bare, cpu_bare = _one_run(scenario, trace, requests, None)
        progress("the harness floor: the same trace with TEs that answer at once (log on)")
        floor, wall_floor, _ = _one_run(scenario, trace, requests, os.path.join(tmp, "floor.db"), build_instant)
    n = logged["requests"]
    if split != logged:  # the split must not change a number it reports
        raise RuntimeError("bench sim: the split run's metrics differ from the one-process run's")
    title = (f"bench sim: {scenario_name} on {Path(trace).name}, {n} requests, {workers} workers "
             f"(target >= {TARGET_REQUESTS_PER_WALL_S:,.0f} requests per wall s with the log on)")  # fmt: skip
    rows = [
        Row("sim_requests_per_wall_s", n / wall_split, "requests/s",
            "sim_requests_per_wall_s_one_process", n / wall_logged),
        Row("sim_requests_per_wall_s_one_process", n / wall_logged, "requests/s",
            "sim_requests_per_wall_s_log_off", bare["requests"] / wall_bare),
        Row("platform_requests_per_wall_s", platform["requests"] / wall_platform, "requests/s",
            "sim_requests_per_wall_s_one_process", n / wall_logged),
        Row("harness_requests_per_wall_s", floor["requests"] / wall_floor, "requests/s",
            "sim_requests_per_wall_s_one_process", n / wall_logged),
        Row("sim_requests_per_cpu_s", n / cpu_logged, "requests/s",
            "sim_requests_per_cpu_s_log_off", bare["requests"] / cpu_bare),
        Row("requests", float(n), "requests", "completed", float(logged["completed"])),
        Row("prefix_hit_rate", logged["prefix_hit_rate"], "ratio", "platform_prefix_hit_rate",
            platform["prefix_hit_rate"]),
        Row("ttft_ms_p50", logged["ttft_ms_p50"], "ms"),
        Row("tpot_ms_p50", logged["tpot_ms_p50"], "ms"),
        Row("workers", float(workers), "processes"),
        Row("wall_s", wall_split, "s", "wall_s_one_process", wall_logged),
    ]  # fmt: skip
    return title, rows
