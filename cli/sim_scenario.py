"""`deepserve sim CONFIG [--trace PATH] [--requests N] [--seed N] [--log PATH] [--set K=V]...
[--json]` for platform configs (a built-in scenario name or a TOML file: a scenario or a daemon
config, one schema — deepserve.cluster.schema). One worker runs the whole platform
(`deepserve.cluster.sim`: gateway, JEs, control plane, TEs); `--workers N` splits a colocated
cluster by server over processes, each running its TEs behind the workload dispatcher (a split
run shares no gateway, JE or cluster manager: deepserve/cluster/parallel.py).

The `sim` parser itself lives with the other commands (cli/sim.py); it calls `add_arguments` and hands
every scenario that is not one of its own to `run`. Bad input — the scenario file, an override, the
trace — becomes a `CliError`: exit 2, one line naming the file, the line or the key.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deepserve.adapters.scenario.loader import ScenarioError, builtin_names, trace_path
from deepserve.adapters.traces import TraceError, open_trace
from deepserve.cmdline import CliError, positive_int, print_json

NO_LOG = "none"
# The cyclic GC's first threshold while `deepserve sim` simulates in this process (cli/main.py
# sets 10,000 for every command). A simulation's containers mostly die young or live to its end
# (queued envelopes, jobs, results, the JE's tree); at 10,000 the collector ran ~110 times over the
# whole Mooncake trace on the platform and took 0.9 s of ~13 s CPU re-walking the survivors
# (measured with gc.callbacks), at 1,000,000 it ran none (0.02 s, all at start-up) while
# collecting 2.3k objects fewer out of millions. A batch run that ends; a daemon keeps 10,000.
SIM_GC_GEN0_THRESHOLD = 1_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", metavar="PATH",
                   help="Mooncake JSONL or Azure CSV (told apart by content) instead of the scenario's")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field, e.g. cluster.tes=8 (repeatable; validated like the file)")  # fmt: skip
    p.add_argument("--workers", type=positive_int, default=1, metavar="N",
                   help="split a colocated cluster by server over N processes (the same results; "
                        "the log becomes a directory of one file per worker, default runs/<scenario>-<seed>/)")  # fmt: skip


def handles(name: str) -> bool:
    """Whether `name` is a FlowServe scenario (built-in or a TOML file) rather than a legacy one."""
    return name in builtin_names() or name.endswith(".toml") or Path(name).is_file()


def run(args: argparse.Namespace, prepare_log: Callable[[Path], None]) -> int:
    from deepserve.adapters.scenario.partition import ParallelError, plan_partitions
    from deepserve.adapters.scenario.sched import Scheduling
    from deepserve.cluster.config import load
    from deepserve.cluster.sim import dispatcher_scenario

    try:
        overrides = list(args.overrides)
        if args.seed is not None:
            overrides.append(f"seed={args.seed}")
        cfg = load(args.scenario, overrides, "sim")
        scenario = cfg.scenario()
        if cfg.scheduling.entry == "dispatcher" or (args.workers > 1 and cfg.scheduling == Scheduling()):
            # a split run has no gateway nor JE: its TEs stand behind the workload dispatcher
            scenario = dispatcher_scenario(cfg)
        trace = open_trace(trace_path(args.trace or scenario.workload.trace))
        parts = plan_partitions(scenario, args.workers) if args.workers > 1 else [None]
    except (ScenarioError, TraceError, ParallelError) as exc:
        raise CliError(str(exc)) from None
    total = _requests(args.requests, scenario.workload.requests, trace)
    if args.workers > 1:  # a run directory, even when the cluster has one server (one worker)
        target, logs = _worker_logs(args, scenario, parts, prepare_log)
    else:
        target, logs = args.log or scenario.log or f"runs/{scenario.name}-{scenario.seed}.db", None
    sink = None
    if len(parts) == 1 and target != NO_LOG:
        from deepserve.persistence import open_sink

        path = logs[0] if logs else target  # _worker_logs has prepared its files
        if "://" not in path and not logs:
            prepare_log(Path(path))
        sink = open_sink(path, "async", writer="process")
    bar = _progress(total, quiet=args.json)
    t0 = time.perf_counter()
    thresholds = gc.get_threshold()
    gc.set_threshold(SIM_GC_GEN0_THRESHOLD, *thresholds[1:])
    try:
        result = _run(cfg, scenario, trace.path, args.requests or None, parts, sink, logs, bar)
    except (ScenarioError, TraceError) as exc:
        raise CliError(str(exc)) from None
    finally:  # back to the command's threshold without collecting the run's survivors now (a
        gc.freeze()  # first collection at 10,000 would walk them all: 0.24 s): they join the
        gc.set_threshold(*thresholds)  # oldest generation as if they had aged there
        gc.unfreeze()
        if bar is not None:
            bar.close()
        if sink is not None:
            sink.close()
    wall = time.perf_counter() - t0
    out = report(scenario.name, scenario.seed, trace.path, result, wall, target, workers=len(parts))
    if args.json:
        print_json(out)
    else:
        _print(out)
    return 0


def _run(cfg: Any, split: Any, trace: str, requests: int | None, parts: list[Any], sink: Any,
         logs: list[str] | None, bar: Any) -> Any:  # fmt: skip
    from deepserve.cluster.parallel import WorkerError, run_parallel
    from deepserve.cluster.run import run_scenario
    from deepserve.cluster.sim import run as run_platform

    if len(parts) == 1 and (split.scheduling is not None or cfg.scheduling.entry == "dispatcher"):
        # the assembly's variant for the config's `scheduling.entry` (cluster/sim.py `run`)
        return run_platform(cfg, trace=trace, requests=requests, sink=sink,
                            on_done=(lambda _d: bar.update(1)) if bar is not None else None)  # fmt: skip
    if len(parts) == 1:
        return run_scenario(split, trace=trace, requests=requests, sink=sink,
                            on_done=(lambda _d: bar.update(1)) if bar is not None else None)  # fmt: skip
    try:
        return run_parallel(split, parts, trace=trace, requests=requests, logs=logs,
                            on_progress=bar.update if bar is not None else None)  # fmt: skip
    except WorkerError as exc:
        if exc.kind in ("TraceError", "ScenarioError"):  # the whole run's bad input, one line
            raise CliError(str(exc)) from None
        raise


def _worker_logs(args: argparse.Namespace, scenario: Any, parts: list[Any],
                 prepare_log: Callable[[Path], None]) -> tuple[str, list[str] | None]:  # fmt: skip
    """The run directory of a split run and its workers' log files (fresh: a previous run's
    worker logs in it are replaced, so that verify sees this run's files only)."""
    from deepserve.adapters.scenario.partition import is_worker_log, worker_log_names

    target = args.log or scenario.log or f"runs/{scenario.name}-{scenario.seed}"
    if target == NO_LOG:
        return target, None
    if "://" in target or target.endswith(".db"):
        raise CliError(f"--log {target}: a run over {len(parts)} workers writes one SQLite log per "
                       "worker: give a directory")  # fmt: skip
    folder = Path(target)
    names = worker_log_names(parts)
    prepare_log(folder / names[0])  # creates the default directory; a given one must exist
    if folder.is_dir():
        for old in sorted(folder.iterdir()):
            if is_worker_log(old.name) and old.name != names[0]:
                prepare_log(old)
    return target, [str(folder / n) for n in names]


def report(name: str, seed: int, trace: str, result: Any, wall_s: float, log: str,
           workers: int = 1) -> dict[str, Any]:  # fmt: skip
    s = result.summary
    out: dict[str, Any] = {"scenario": name, "seed": seed, "trace": trace}
    out.update({k: s[k] for k in ("requests", "completed", "failed", "cancelled")})
    for k, v in s.items():
        if k not in out and k != "failure_reasons":
            out[k] = round(v, 6) if isinstance(v, float) else v
    out["failure_reasons"] = s["failure_reasons"]
    out["virtual_time_s"] = round(result.virtual_time_s, 6)
    out["deliveries"] = result.deliveries
    out["wall_s"] = round(wall_s, 3)
    out["sim_requests_per_wall_s"] = round(s["requests"] / wall_s, 1) if wall_s > 0 else 0.0
    out["workers"] = workers
    out["log"] = log
    return out


def _requests(flag: int | None, field: int, trace: Any) -> int:
    """How many requests the run takes from the trace; more than it holds is refused (a run that
    quietly took fewer would report numbers for a load nobody asked for)."""
    rows = trace.rows()
    wanted = flag or field
    if wanted > rows:
        what = f"--requests {flag}" if flag else f"workload.requests = {field}"
        whole = "leave --requests out" if flag else "0"
        raise CliError(f"{what}: the trace {trace.path} has {rows} requests ({whole} for all of them)")
    return wanted or rows


def _progress(total: int, quiet: bool) -> Any:
    """A progress bar on a terminal only (never in pipes, CI logs or --json output)."""
    if quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="sim", file=sys.stderr, mininterval=0.25)


def _print(out: dict[str, Any]) -> None:
    rows = [
        ("requests", f"{out['requests']} ({out['completed']} completed, {out['failed']} failed, "
                     f"{out['cancelled']} cancelled)"),
        ("TTFT ms", _pcts(out, "ttft_ms", "mean", "p50", "p90", "p99")),
        ("TPOT ms", _pcts(out, "tpot_ms", "mean", "p50", "p90", "p99")),
        ("e2e ms", _pcts(out, "e2e_ms", "p50", "p90", "p99")),
        ("prefix hit rate", f"{out['prefix_hit_rate']:.3f} (cached prompt tokens / prompt tokens)"),
        ("throughput", f"{out['throughput_rps']:.2f} req/s, {out['output_tokens_per_s']:.0f} output tok/s "
                       f"over {out['duration_s']:.1f} virtual s"),
        ("wall", f"{out['wall_s']:.2f} s ({out['sim_requests_per_wall_s']:.0f} simulated requests per wall s"
                 f"{', ' + str(out['workers']) + ' workers' if out['workers'] > 1 else ''})"),
    ]  # fmt: skip
    if "tes_target" in out:  # the whole platform's run (not the dispatcher's): the control plane's view
        rows.insert(5, ("cluster", f"{out['tes_ready_at_end']}/{out['tes_target']} TEs ready at the end, "
                                   f"{out['recoveries']} recoveries, {out['faults_injected']} faults injected"))
        rows.insert(5, ("SLO attainment", f"{out['slo_attainment']:.3f} (TTFT <= {out['slo_ttft_ms']:g} ms and "
                                          f"TPOT <= {out['slo_tpot_ms']:g} ms, of all requests)"))  # fmt: skip
    if out["failed"]:
        rows.insert(4, ("e2e ms, failed", _pcts(out, "failed_e2e_ms", "p50", "p90", "p99", "max")
                        + f"  (arrival to failure, {out['failed']} failed)"))  # fmt: skip
    for model, m in out.get("by_model", {}).items():
        rows.append((model, f"{m['requests']} requests ({m['completed']} completed, {m['failed']} failed), "
                            f"TTFT p99 {m['ttft_ms_p99']:.1f} ms, e2e p99 {m['e2e_ms_p99']:.1f} ms"))  # fmt: skip
    for fault in out.get("faults", ()):  # the per-fault accounting (cluster/sim.py `_fault_report`)
        rows.append(("fault", _fault_text(fault).removeprefix("fault ")))
    for reason, n in out["failure_reasons"].items():
        rows.append(("failed", f"{n} x {reason}"))
    width = max(len(k) for k, _ in rows)
    print(f"scenario {out['scenario']} (seed {out['seed']}), trace {out['trace']}")
    for k, v in rows:
        print(f"  {k:>{width}}  {v}")
    print(f"log: {out['log']}")


def _fault_text(fault: dict[str, Any]) -> str:
    import msgspec

    from deepserve.actors.cluster.recovery_report import FaultLine

    return msgspec.convert(fault, FaultLine).text()


def _pcts(out: dict[str, Any], key: str, *stats: str) -> str:
    """`mean 1.0  p50 2.0 ...` of a metric, or "none" when no request had it (NaN, not `nan`)."""
    if math.isnan(out[f"{key}_{stats[0]}"]):
        return "none (no completed request)" if key != "failed_e2e_ms" else "none"
    return "  ".join(f"{stat} {out[f'{key}_{stat}']:.1f}" for stat in stats)
