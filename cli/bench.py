"""`deepserve bench ...` subcommands: the kernel, transport and devices suites here, each other
suite in its own module (`bench_<suite>.py`, registered below in `--help`'s order)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from deepserve.benchmarks.table import as_json_lines, render
from deepserve.cli import (
    bench_autoscale,
    bench_http,
    bench_policies,
    bench_recovery,
    bench_replay,
    bench_routing,
    bench_scaling,
    bench_sim,
)
from deepserve.cli.util import one_line, require_driver
from deepserve.cmdline import CliError

# Below this every workload still has a few hundred operations (the AsyncDriver stream
# needs 64 messages a tick); above it a run takes hours. Both measured, not guessed:
# `--scale 0.0005` still runs, `1e-5` divided by zero.
SCALE_MIN, SCALE_MAX = 0.001, 100.0
PG_CONNECT_S = 15.0
ROUNDS_MAX = 20


def _rounds(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= ROUNDS_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to {ROUNDS_MAX}, got {text!r}")
    return int(text)


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not SCALE_MIN <= value <= SCALE_MAX:
        raise argparse.ArgumentTypeError(f"must be between {SCALE_MIN:g} and {SCALE_MAX:g}, got {text}")
    return value


def _flow_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 10:
        raise argparse.ArgumentTypeError(f"must be >= 10: {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="performance suite: one table, baselines measured in the same run")
    which = bench.add_subparsers(dest="bench_command", metavar="SUITE", required=True)
    kernel = which.add_parser("kernel", help="actor kernel, event store and replay throughput")
    kernel.add_argument("--json", action="store_true", help="print rows as JSON lines")
    kernel.add_argument("--scale", type=_scale, default=1.0,
                        help=f"multiply every workload size, {SCALE_MIN:g} to {SCALE_MAX:g} (default 1.0)")
    kernel.add_argument("--pg", metavar="URL", default=None,
                        help="also measure the store on this PostgreSQL server (checked first)")
    kernel.set_defaults(func=_run_kernel)
    bench_sim.register(which)
    bench_policies.register(which)
    transport = which.add_parser("transport", help="ZeroMQ transport between two OS processes vs raw pyzmq")
    transport.add_argument("--json", action="store_true", help="print rows as JSON lines")
    transport.add_argument("--scale", type=_scale, default=1.0,
                           help=f"multiply every workload size, {SCALE_MIN:g} to {SCALE_MAX:g} (default 1.0)")
    transport.add_argument("--rounds", type=_rounds, default=3,
                           help=f"runs of each workload, best kept, 1 to {ROUNDS_MAX} (default 3)")
    transport.set_defaults(func=_run_transport)
    devices = which.add_parser("devices", help="emulated fabric under many concurrent transfers")
    devices.add_argument("--json", action="store_true", help="print rows as JSON lines")
    devices.add_argument("--flows", type=_flow_count, default=1000,
                         help="concurrent transfers (default 1000; the baseline runs a tenth)")
    devices.set_defaults(func=_run_devices)
    bench_routing.register(which)
    bench_http.register(which)
    bench_recovery.register(which)
    bench_scaling.register(which)
    bench_autoscale.register(which)
    bench_replay.register(which)


def check_pg(url: str) -> None:
    """Refuse a PostgreSQL URL that is malformed or whose server does not answer, before
    any suite runs: a typo must not cost the whole benchmark's time."""
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    from deepserve.persistence.target import parse_target

    require_driver(url)
    target = parse_target(url)  # a malformed URL: a one-line LogError
    if target.kind != "postgresql":
        raise CliError(f"--pg {url}: not a PostgreSQL URL (postgresql://USER@HOST/DATABASE)")

    async def ping() -> None:
        engine = create_async_engine(target.url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
        finally:
            await engine.dispose()

    try:
        asyncio.run(asyncio.wait_for(ping(), PG_CONNECT_S))
    except Exception as exc:  # noqa: BLE001 — any failure to answer is the URL's problem
        cause = getattr(exc, "orig", None) or exc
        text = one_line(str(cause)) or type(cause).__name__
        raise CliError(f"--pg {target.label}: cannot connect: {text}") from None


def _run_kernel(args: argparse.Namespace) -> int:
    from deepserve.benchmarks.kernel import kernel_bench

    if args.pg is not None:
        check_pg(args.pg)

    def progress(label: str) -> None:
        if not args.json:
            print(f"measuring {label} ...", file=sys.stderr, flush=True)

    title, rows = kernel_bench(args.scale, args.pg, progress)
    print(as_json_lines(rows) if args.json else render(title, rows))
    return 0


def _run_transport(args: argparse.Namespace) -> int:
    from deepserve.benchmarks.transport import transport_bench

    def progress(label: str) -> None:
        if not args.json:
            print(f"measuring {label} ...", file=sys.stderr, flush=True)

    title, rows = transport_bench(args.scale, progress, args.rounds)
    print(as_json_lines(rows) if args.json else render(title, rows))
    return 0


def _run_devices(args: argparse.Namespace) -> int:
    from deepserve.benchmarks.devices import devices_bench

    def progress(label: str) -> None:
        if not args.json:
            print(f"measuring {label} ...", file=sys.stderr, flush=True)

    title, rows = devices_bench(args.flows, progress)
    print(as_json_lines(rows) if args.json else render(title, rows))
    return 0
