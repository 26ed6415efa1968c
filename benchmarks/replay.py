"""`deepserve bench replay`: a what-if of a whole trace against simulating it (issue 32, Speed).

In one run: `deepserve sim`'s run of the scenario (the whole platform, log on, as the command
writes it) is the baseline `sim_s`; then `replay whatif` on that log — its inputs and the
original column read off the log, and the cluster re-simulated under a changed routing policy,
no log written (the command's default) — is `whatif_s`, split into its read and its
re-simulation. A what-if with nothing changed is timed too, and must give the run's own summary
(checked: a bench row of a what-if that does not reproduce the run would be meaningless).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .sim import bench_trace
from .table import Row

CHANGE = "scheduling.policy=least_load"  # the what-if timed: another routing policy
WALL_KEYS = ("wall_s",)


def _sim(cfg: Any, trace: str, requests: int | None, log: str) -> tuple[Any, float, float]:
    from deepserve.cluster.sim import run
    from deepserve.persistence import open_sink

    t0, c0 = time.perf_counter(), time.process_time()
    sink = open_sink(log, "async", writer="process")
    try:
        result = run(cfg, trace=trace, requests=requests, sink=sink)
    finally:
        sink.close()
    return result, time.perf_counter() - t0, time.process_time() - c0


def _whatif(log: str, overrides: list[str]) -> tuple[Any, float, float, float]:
    """(result, whole wall s, the log read's wall s, whole CPU s) of `replay whatif LOG --set ...`."""
    from deepserve.cluster.whatif import config_of, whatif
    from deepserve.replay.inputs import open_run

    t0, c0 = time.perf_counter(), time.process_time()
    inputs = open_run(log)
    read = time.perf_counter() - t0
    cfg = config_of(inputs, None, overrides)
    result = whatif(inputs, cfg, inputs.manager, changes=overrides)
    return result, time.perf_counter() - t0, read, time.process_time() - c0


def replay_bench(requests: int | None, progress: Callable[[str], None], scenario: str = "mooncake-16te",
                 overrides: tuple[str, ...] = ()) -> tuple[str, list[Row]]:  # fmt: skip
    from deepserve.cluster.config import load

    cfg = load(scenario, overrides, "sim")  # a bad override: refused before anything runs
    trace = bench_trace()
    with tempfile.TemporaryDirectory(prefix="deepserve-bench-replay-") as tmp:
        log = os.path.join(tmp, "sim.db")
        progress("deepserve sim, the whole platform, log on (the baseline)")
        sim, sim_s, sim_cpu_s = _sim(cfg, trace, requests, log)
        progress(f"replay whatif --set {CHANGE} on its log")
        changed, whatif_s, read_s, whatif_cpu_s = _whatif(log, [CHANGE])
        progress("replay whatif with no change (must reproduce the run)")
        same, same_s, _, _ = _whatif(log, [])
    a, b = sim.summary, same.whatif.summary
    if {k: v for k, v in a.items() if k not in WALL_KEYS} != {k: v for k, v in b.items() if k not in WALL_KEYS}:
        raise RuntimeError("bench replay: a what-if with no change did not reproduce the run's summary")
    if same.original.summary != {k: v for k, v in a.items()}:
        raise RuntimeError("bench replay: the what-if's original column is not the run's own summary")
    n = sim.summary["requests"]
    title = f"bench replay: {scenario} on {Path(trace).name}, {n} requests (target: whatif_s <= sim_s)"
    w = changed.whatif.summary
    rows = [
        Row("whatif_s", whatif_s, "s", "sim_s", sim_s),
        Row("whatif_read_s", read_s, "s", "sim_s", sim_s),
        Row("whatif_resim_s", changed.whatif.wall_s, "s", "sim_s", sim_s),
        Row("whatif_nochange_s", same_s, "s", "sim_s", sim_s),
        Row("whatif_cpu_s", whatif_cpu_s, "s", "sim_cpu_s (main process; the log writer's own CPU not counted)",
            sim_cpu_s),
        Row("requests", float(n), "requests", "whatif_requests", float(w["requests"])),
        Row("ttft_ms_p99", sim.summary["ttft_ms_p99"], "ms", f"whatif ({CHANGE})", w["ttft_ms_p99"]),
    ]  # fmt: skip
    return title, rows
