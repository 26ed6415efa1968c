"""The `deepserve bench replay` subcommand (a suite of cli/bench.py); the bench is benchmarks/replay.py."""

from __future__ import annotations

import argparse
import sys

from deepserve.benchmarks.table import as_json_lines, render
from deepserve.cmdline import CliError, positive_int


def register(which: argparse._SubParsersAction) -> None:
    p = which.add_parser("replay", help="a what-if of a whole trace against simulating it (issue 32)")
    p.add_argument("--json", action="store_true", help="print rows as JSON lines")
    p.add_argument("--requests", type=positive_int, metavar="N",
                   help="only the first N requests of the trace (default: all)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the mooncake-16te scenario (repeatable)")
    p.add_argument("--rounds", type=positive_int, default=1, metavar="N",
                   help="runs of the sim and the what-if, alternating, the fastest of each kept (default 1)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from deepserve.adapters.scenario.loader import ScenarioError
    from deepserve.adapters.traces import TraceError
    from deepserve.benchmarks.replay import replay_bench

    def progress(label: str) -> None:
        if not args.json:
            print(f"measuring {label} ...", file=sys.stderr, flush=True)

    try:
        title, rows = replay_bench(args.requests, progress, overrides=tuple(args.overrides), rounds=args.rounds)
    except (ScenarioError, TraceError) as exc:
        raise CliError(str(exc)) from None
    print(as_json_lines(rows) if args.json else render(title, rows))
    return 0
