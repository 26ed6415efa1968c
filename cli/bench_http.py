"""The `deepserve bench http` subcommand (a suite of cli/bench.py); the bench is benchmarks/http.py."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

from deepserve.benchmarks.table import as_json_lines, render
from deepserve.cmdline import CliError, positive_int

EXIT_BENCH_FAILED = 1


def register(which: argparse._SubParsersAction) -> None:
    p = which.add_parser("http", help="daemon HTTP throughput and platform overhead vs a bare uvicorn SSE endpoint")
    p.add_argument("--json", action="store_true", help="print rows as JSON lines")
    p.add_argument("--requests", type=positive_int, default=200, metavar="N", help="requests per side (default 200)")
    p.add_argument("--concurrency", type=positive_int, default=16, metavar="C",
                   help="requests in flight at once (default 16)")
    p.add_argument("--tokens", type=positive_int, default=16, metavar="T",
                   help="output tokens per request (at most the daemon's daemon.max_tokens_limit)")
    from deepserve.benchmarks.http_cost import add_cost_args

    add_cost_args(p)  # the cost rows (issue 30 §1): benchmarks/http_cost.py
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from deepserve.benchmarks.http import BenchFailed, http_bench
    from deepserve.daemon.config import load_config

    limit = load_config().daemon.max_tokens_limit  # the config the bench's daemon starts with
    if args.tokens > limit:  # every request would fail with a 400: refused before anything starts
        raise CliError(f"--tokens {args.tokens}: the daemon takes at most {limit} (daemon.max_tokens_limit)")

    def progress(label: str) -> None:
        if not args.json:
            print(f"measuring {label} ...", file=sys.stderr, flush=True)

    from deepserve.benchmarks.http_cost import cost_rows

    try:
        with _terminate_as_exit():
            title, rows = http_bench(args.requests, args.concurrency, args.tokens, progress)
            rows += cost_rows(args, progress)
    except BenchFailed as exc:
        print(f"deepserve: bench http failed: {exc}", file=sys.stderr)
        return EXIT_BENCH_FAILED
    print(as_json_lines(rows) if args.json else render(title, rows))
    return 0


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(143), so that the bench's `finally` stops its servers (killed
    at once, the bench left its uvicorn running)."""

    def exit_on_term(_signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signal.SIGTERM)

    before = signal.signal(signal.SIGTERM, exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
