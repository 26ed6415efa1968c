"""The `deepserve bench sim` subcommand (a suite of cli/bench.py); the bench is benchmarks/sim.py."""

from __future__ import annotations

import argparse
import sys

from deepserve.benchmarks.table import as_json_lines, render
from deepserve.cmdline import positive_int


def register(which: argparse._SubParsersAction) -> None:
    sim = which.add_parser("sim", help="simulated requests per wall second on a whole trace (issue 10)")
    sim.add_argument("--json", action="store_true", help="print rows as JSON lines")
    sim.add_argument("--requests", type=positive_int, metavar="N",
                     help="only the first N requests of the trace (default: all)")
    sim.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a field of the mooncake-16te scenario (repeatable)")
    sim.add_argument("--dynamo", action="store_true",
                     help="instead: `deepserve sim` against NVIDIA Dynamo's mocker on the same trace, side by "
                          "side (issue 31 section 5; the mocker from the optional extra `dynamo`)")
    sim.add_argument("--rounds", type=positive_int, metavar="N",
                     help="with --dynamo: runs of each side, alternating, the fastest kept (default 1)")
    sim.set_defaults(func=_run_sim)


def _run_sim(args: argparse.Namespace) -> int:
    from deepserve.adapters.scenario.loader import ScenarioError
    from deepserve.adapters.traces import TraceError
    from deepserve.benchmarks.sim import sim_bench
    from deepserve.benchmarks.sim_dynamo import NOT_INSTALLED, DynamoBenchError, dynamo_bench
    from deepserve.cmdline import CliError

    def progress(label: str) -> None:
        if label == NOT_INSTALLED:  # said even with --json: the table lacks rows it was asked for
            print(label, file=sys.stderr, flush=True)
        elif not args.json:
            print(f"measuring {label} ...", file=sys.stderr, flush=True)

    from deepserve.adapters.scenario.partition import ParallelError

    try:
        _check_requests(args.requests)
        if args.rounds is not None and not args.dynamo:
            raise CliError("--rounds: only with --dynamo (bench sim's own rows are measured once)")
        if args.dynamo:
            title, rows = dynamo_bench(args.requests, args.rounds or 1, progress, overrides=tuple(args.overrides))
        else:
            title, rows = sim_bench(args.requests, progress, overrides=tuple(args.overrides))
    except (ScenarioError, TraceError, DynamoBenchError) as exc:
        raise CliError(str(exc)) from None
    except ParallelError as exc:  # bench sim always splits the run by server
        raise CliError(f"--set: bench sim splits the run over the cores, which this scenario cannot be: "
                       f"{str(exc).removeprefix('--workers: ').split('; run it with')[0]}") from None  # fmt: skip
    print(as_json_lines(rows) if args.json else render(title, rows))
    return 0


def _check_requests(requests: int | None) -> None:
    """More requests than the bench's trace holds are refused (the run took fewer, silently)."""
    from deepserve.adapters.traces import open_trace
    from deepserve.benchmarks.sim import bench_trace
    from deepserve.cmdline import CliError

    trace = open_trace(bench_trace())
    if requests is not None and requests > (rows := trace.rows()):
        raise CliError(f"--requests {requests}: the trace {trace.path} has {rows} requests "
                       "(leave --requests out for all of them)")  # fmt: skip
