"""`deepserve bench replay`: a what-if of a whole trace against simulating it (issue 32, Speed).

In one run: `deepserve sim`'s run of the scenario (the whole platform, log on, as the command
writes it) is the baseline `sim_s`; then `replay whatif` on that log with nothing changed — its
inputs and the original column read off the log, the cluster re-simulated (no log written: the
command's default), every decision compared with the log's — is `whatif_s`, with its read
`whatif_read_s`. The no-change what-if must give the run's own summary in both columns (checked:
a row of a what-if that does not reproduce the run would be meaningless), which makes it the same
work as the run; a what-if under another routing policy (`whatif_policy_s`) does other work and
is shown for scale only. CPU seconds count the sim's log writer process too. `whatif_from_half_s`
is the same no-change what-if forked at half the run's virtual time (`--from T`: the driver
restored from the log at T, only the rest run), against `whatif_s` in the same round; it must
reproduce the run's summary too.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .sim import bench_trace
from .table import Row

CHANGE = "scheduling.policy=least_load"  # the what-if timed: another routing policy
WALL_KEYS = ("wall_s", "scaling_actions")  # (a what-if's summaries count scaling actions; sim's do not)


def _cpu() -> float:
    """This process's CPU seconds and its waited-for children's (the log writer process)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def _sim(cfg: Any, trace: str, requests: int | None, log: str) -> tuple[Any, float, float]:
    from deepserve.cluster.sim import run
    from deepserve.persistence import open_sink

    t0, c0 = time.perf_counter(), _cpu()
    sink = open_sink(log, "async", writer="process")
    try:
        result = run(cfg, trace=trace, requests=requests, sink=sink)
    finally:
        sink.close()
    return result, time.perf_counter() - t0, _cpu() - c0


def _whatif(log: str, overrides: list[str], from_s: float | None = None) -> tuple[Any, float, float, float]:
    """(result, whole wall s, the log read's wall s, whole CPU s) of `replay whatif LOG --set ...`
    (`--from from_s`: forked there, restored from the log)."""
    from deepserve.cluster.whatif import config_of, whatif
    from deepserve.replay.fork import Cut
    from deepserve.replay.inputs import open_run

    t0, c0 = time.perf_counter(), _cpu()
    inputs = open_run(log, cut=Cut(from_s) if from_s is not None else None)
    read = time.perf_counter() - t0
    cfg = config_of(inputs, None, overrides)
    result = whatif(inputs, cfg, inputs.manager, changes=overrides, from_s=from_s)
    return result, time.perf_counter() - t0, read, _cpu() - c0


def replay_bench(requests: int | None, progress: Callable[[str], None], scenario: str = "mooncake-16te",
                 overrides: tuple[str, ...] = (), rounds: int = 1) -> tuple[str, list[Row]]:  # fmt: skip
    """`rounds` of (sim, what-if with no change), alternating, the fastest of each kept (a shared
    machine's load comes and goes); then one what-if under another routing policy."""
    from deepserve.cluster.config import load

    cfg = load(scenario, overrides, "sim")  # a bad override: refused before anything runs
    trace = bench_trace()
    best: dict[str, tuple[float, ...]] = {}
    with tempfile.TemporaryDirectory(prefix="deepserve-bench-replay-") as tmp:
        log = os.path.join(tmp, "sim.db")
        for k in range(rounds):
            if os.path.exists(log):
                os.remove(log)
            progress(f"round {k + 1}: deepserve sim, the whole platform, log on (the baseline)")
            sim, sim_s, sim_cpu = _sim(cfg, trace, requests, log)
            progress(f"round {k + 1}: replay whatif with no change on its log")
            same, same_s, read_s, same_cpu = _whatif(log, [])
            _check(sim, same)
            progress(f"round {k + 1}: replay whatif --from half the run, no change, on its log")
            half, half_s, _, half_cpu = _whatif(log, [], sim.virtual_time_s / 2)
            _check(sim, half)
            best["sim"] = min(best.get("sim", (sim_s, sim_cpu)), (sim_s, sim_cpu))
            best["same"] = min(best.get("same", (same_s, read_s, same_cpu)), (same_s, read_s, same_cpu))
            best["half"] = min(best.get("half", (half_s, half_cpu)), (half_s, half_cpu))
        progress(f"replay whatif --set {CHANGE} on its log")
        changed, changed_s, _, _ = _whatif(log, [CHANGE])
    n = sim.summary["requests"]
    title = (f"bench replay: {scenario} on {Path(trace).name}, {n} requests, best of {rounds} "
             "(target: whatif_s <= sim_s)")  # fmt: skip
    w = changed.whatif.summary
    (sim_s, sim_cpu), (same_s, read_s, same_cpu), (half_s, half_cpu) = best["sim"], best["same"], best["half"]
    rows = [
        Row("whatif_s", same_s, "s", "sim_s", sim_s),
        Row("whatif_read_s", read_s, "s", "sim_s", sim_s),
        Row("whatif_cpu_s", same_cpu, "s", "sim_cpu_s (with its log writer process)", sim_cpu),
        Row("whatif_from_half_s", half_s, "s", "whatif_s (the whole run; target: about half)", same_s),
        Row("whatif_from_half_cpu_s", half_cpu, "s", "whatif_cpu_s", same_cpu),
        Row("whatif_policy_s", changed_s, "s", "sim_s (the recorded policy: not the same work)", sim_s),
        Row("requests", float(n), "requests", "whatif_requests", float(w["requests"])),
        Row("ttft_ms_p99", sim.summary["ttft_ms_p99"], "ms", f"whatif ({CHANGE})", w["ttft_ms_p99"]),
    ]  # fmt: skip
    return title, rows


def _check(sim: Any, same: Any) -> None:
    a, b = sim.summary, same.whatif.summary
    if {k: v for k, v in a.items() if k not in WALL_KEYS} != {k: v for k, v in b.items() if k not in WALL_KEYS}:
        raise RuntimeError("bench replay: a what-if with no change did not reproduce the run's summary")
    if {k: v for k, v in same.original.summary.items() if k not in WALL_KEYS} != a:
        raise RuntimeError("bench replay: the what-if's original column is not the run's own summary")
