"""`deepserve bench sim --dynamo`: `deepserve sim` against NVIDIA Dynamo's mocker, side by side.

Issue 31 §5: `deepserve sim mooncake-16te` on the whole Mooncake conversation trace, log on, must
take no more wall time than Dynamo's Rust mocker replaying the same trace on 16 workers with its
KV router, measured in the same run. Both sides run as their own process, timed from outside
(start-up included): `deepserve sim SCENARIO --trace T --log <tmp> --json` exactly as a user types
it (whatever the checkout's `sim` is), and `sim_dynamo_child.py` (the mocker's offline replay, its
virtual clock: the fastest mode it has). The mocker runs three ways: with the scenario's cluster
(its KV blocks, HBM pool, DRAM tier, batch limits: the comparable run, and the baseline), with the
HBM pool only, and with the mocker's own defaults (16,384 blocks a worker, no host tier: the least
work it does). docs/sim.md says what is and is not comparable.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from deepserve.benchmarks.table import Row

CHILD = Path(__file__).with_name("sim_dynamo_child.py")
DYNAMO_DIST = "ai-dynamo-runtime"
NOT_INSTALLED = (f"bench sim --dynamo: {DYNAMO_DIST} is not installed (pip install -e '.[dynamo]'); "
                 "the mocker's rows are skipped")  # fmt: skip
# The mocker runs: name suffix, which KV sizing (see mocker_engine).
MOCKER_RUNS = (("", "cluster"), ("_hbm_only", "hbm"), ("_default_kv", "default"))


class DynamoBenchError(ValueError):
    """A scenario the mocker cannot mirror, or a side that failed; one line for the CLI."""


def dynamo_version() -> str | None:
    try:
        return metadata.version(DYNAMO_DIST)
    except metadata.PackageNotFoundError:
        return None


def check_mirrorable(scenario: Any) -> None:
    """The mocker mirrors colocated TEs of one DP group: anything else is refused, whether or not
    the mocker is installed (the refusal is about the comparison, not the machine)."""
    c = scenario.cluster
    if c.mode != "colocated" or c.dp_groups != 1:
        raise DynamoBenchError(f"cluster.mode: the mocker comparison mirrors colocated TEs of one DP group, "
                               f"not mode={c.mode!r} with dp_groups={c.dp_groups}")  # fmt: skip


def mocker_engine(scenario: Any, kv: str) -> dict[str, Any]:
    """The mocker's engine config mirroring the scenario's TEs. `kv`: "cluster" (HBM blocks and the
    DRAM tier as host blocks), "hbm" (HBM blocks only) or "default" (the mocker's KV and batch
    defaults; only the block size and the features are set)."""
    from deepserve.cluster.te import kv_sizing

    c = scenario.cluster
    check_mirrorable(scenario)
    engine: dict[str, Any] = {"block_size": c.kv_block_tokens, "enable_prefix_caching": c.prefix_caching,
                              "enable_chunked_prefill": c.scheduler.chunked_prefill}  # fmt: skip
    if kv == "default":
        return engine
    size = kv_sizing(c)
    engine.update(num_gpu_blocks=size.hbm_blocks, max_num_seqs=c.scheduler.max_running,
                  max_num_batched_tokens=c.scheduler.max_batch_tokens)  # fmt: skip
    if kv == "cluster" and size.dram_blocks:
        engine["native_host_offload"] = {"num_host_blocks": size.dram_blocks}
        engine["kv_cache_bytes_per_token"] = size.kv_block_bytes * c.tp // c.kv_block_tokens
    return engine


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[dict, float, float]:
    """Run one side; its JSON on stdout, wall s from outside, CPU s of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DynamoBenchError(f"bench sim --dynamo: {Path(cmd[1]).name} {' '.join(cmd[2:4])} exited "
                               f"{proc.returncode}: {last}")  # fmt: skip
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall, cpu


def run_deepserve(scenario_name: str, trace: str, requests: int | None, overrides: tuple[str, ...],
                  log: str) -> tuple[dict, float, float]:  # fmt: skip
    cmd = [sys.executable, "-m", "deepserve", "sim", scenario_name, "--trace", trace, "--log", log, "--json"]
    cmd += [arg for item in overrides for arg in ("--set", item)]
    if requests is not None:
        cmd += ["--requests", str(requests)]
    return _timed(cmd)


def run_mocker(trace: str, engine: dict[str, Any], workers: int) -> tuple[dict, float, float]:
    # Its log at warn: at info it writes a line per routing decision to stderr (not a replayable
    # log, and slower); warn is its fastest setting.
    env = {**os.environ, "DYN_LOG": "warn"}
    config = json.dumps({"engine": engine, "workers": workers})
    return _timed([sys.executable, str(CHILD), trace, config], env)


def _head(trace: str, requests: int | None, folder: str) -> str:
    """The mocker has no row limit: the first N rows as a file of their own."""
    if requests is None:
        return trace
    path = os.path.join(folder, "head.jsonl")
    with open(trace, encoding="utf-8") as src, open(path, "w", encoding="utf-8") as dst:
        for n, line in enumerate(src):
            if n == requests:
                break
            dst.write(line)
    return path


def _rows(sim: tuple[dict, float, float], mocker: dict[str, tuple[dict, float, float]]) -> list[Row]:
    """deepserve's rows, each against the mocker's matching row when the mocker ran."""
    s, wall, cpu = sim

    def row(name: str, value: float, unit: str, theirs: str, their_value: float | None) -> Row:
        return Row(name, value, unit, *((theirs, float(their_value)) if their_value is not None else ()))

    m, m_wall, m_cpu = mocker.get("", ({}, None, None))
    rows = [row("sim_wall_s", wall, "s", "dynamo_mocker_wall_s", m_wall),
            row("sim_requests_per_wall_s", s["requests"] / wall, "requests/s", "dynamo_mocker_requests_per_wall_s",
                m["num_requests"] / m_wall if m_wall else None),
            row("sim_cpu_s", cpu, "s", "dynamo_mocker_cpu_s", m_cpu)]  # fmt: skip
    rows += [row("sim_wall_s", wall, "s", f"dynamo_mocker_wall_s{suffix}", other[1])
             for suffix, other in mocker.items() if suffix]  # fmt: skip
    # CPU time moves less than wall time with the machine's load (2 cores shared).
    rows += [row("sim_cpu_s", cpu, "s", f"dynamo_mocker_cpu_s{suffix}", other[2])
             for suffix, other in mocker.items() if suffix]  # fmt: skip
    # Each mocker run's wall from outside against its own in-process wall: its start-up cost.
    rows += [row(f"dynamo_mocker_wall_s{suffix}", other[1], "s", f"dynamo_mocker_wall_s{suffix}_in_process",
                 other[0]["wall_s"]) for suffix, other in mocker.items()]  # fmt: skip
    virtual_s = m["duration_ms"] / 1000 if m else None
    rows += [row("requests", float(s["requests"]), "requests", "dynamo_mocker_requests", m.get("completed_requests")),
             row("prefix_hit_rate", s["prefix_hit_rate"], "ratio", "dynamo_mocker_prefix_hit_rate",
                 m.get("prefix_cache_reused_ratio")),
             row("virtual_time_s", s["virtual_time_s"], "s", "dynamo_mocker_virtual_time_s", virtual_s),
             row("ttft_ms_p50", s["ttft_ms_p50"], "ms", "dynamo_mocker_ttft_ms_p50", m.get("median_ttft_ms")),
             row("tpot_ms_p50", s["tpot_ms_p50"], "ms", "dynamo_mocker_tpot_ms_p50", m.get("median_tpot_ms")),
             Row("sim_wall_s_in_process", s["wall_s"], "s")]  # fmt: skip
    return rows


def dynamo_bench(requests: int | None, rounds: int, progress: Callable[[str], None],
                 scenario_name: str = "mooncake-16te", overrides: tuple[str, ...] = ()) -> tuple[str, list[Row]]:  # fmt: skip
    """Each round runs every side once, alternating; each side's fastest round is kept."""
    from deepserve.adapters.scenario.loader import load_scenario
    from deepserve.benchmarks.sim import bench_trace

    scenario = load_scenario(scenario_name, overrides)
    check_mirrorable(scenario)
    version = dynamo_version()
    engines = {suffix: mocker_engine(scenario, kv) for suffix, kv in MOCKER_RUNS} if version else {}
    if version is None:
        progress(NOT_INSTALLED)
    trace = bench_trace()
    best: dict[str, tuple[dict, float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="deepserve-bench-dynamo-") as tmp:
        mocker_trace = _head(trace, requests, tmp)
        for n in range(rounds):
            progress(f"round {n + 1}/{rounds}: deepserve sim {scenario_name}, log on")
            runs = {"sim": run_deepserve(scenario_name, trace, requests, overrides, os.path.join(tmp, "sim.db"))}
            for suffix, engine in engines.items():
                progress(f"round {n + 1}/{rounds}: Dynamo's mocker{suffix.replace('_', ' ')}, "
                         f"{scenario.cluster.tes} workers, KV router")  # fmt: skip
                runs[suffix] = run_mocker(mocker_trace, engine, scenario.cluster.tes)
            for key, run in runs.items():
                if key not in best or run[1] < best[key][1]:
                    best[key] = run
    sim = best.pop("sim")
    against = f"Dynamo mocker {version} (offline replay, KV router)" if version else "Dynamo not installed"
    title = (f"bench sim --dynamo: {scenario_name} on {Path(trace).name}, {sim[0]['requests']} requests, "
             f"{scenario.cluster.tes} TEs / workers, against {against}, best of {rounds}")  # fmt: skip
    return title, _rows(sim, best)
