"""`deepserve bench ...` subcommands."""

from __future__ import annotations

import argparse
import sys

from deepserve.benchmarks.table import as_json_lines, render


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def register_bench(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="performance suite: one table, baselines measured in the same run")
    which = bench.add_subparsers(dest="bench_command", metavar="SUITE", required=True)
    kernel = which.add_parser("kernel", help="actor kernel, event store and replay throughput")
    kernel.add_argument("--json", action="store_true", help="print rows as JSON lines")
    kernel.add_argument("--scale", type=_positive_float, default=1.0,
                        help="multiply every workload size (default 1.0)")
    kernel.add_argument("--pg", metavar="URL", default=None,
                        help="also measure the store on this PostgreSQL server")
    kernel.set_defaults(func=_run_kernel)
    from deepserve.benchmarks.sim_cli import register_sim

    register_sim(which)
    from deepserve.benchmarks.http_cli import register_http

    register_http(which)


def _run_kernel(args: argparse.Namespace) -> int:
    from deepserve.benchmarks.kernel import kernel_bench

    def progress(label: str) -> None:
        if not args.json:
            print(f"measuring {label} ...", file=sys.stderr, flush=True)

    title, rows = kernel_bench(args.scale, args.pg, progress)
    print(as_json_lines(rows) if args.json else render(title, rows))
    return 0
