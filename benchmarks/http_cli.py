"""The `deepserve bench http` subcommand (registered by benchmarks/cli.py)."""

from __future__ import annotations

import argparse
import sys

from deepserve.benchmarks.table import as_json_lines, render
from deepserve.cli.util import positive_int


def register_http(which: argparse._SubParsersAction) -> None:
    p = which.add_parser("http", help="daemon HTTP throughput and platform overhead vs a bare uvicorn SSE endpoint")
    p.add_argument("--json", action="store_true", help="print rows as JSON lines")
    p.add_argument("--requests", type=positive_int, default=200, metavar="N", help="requests per side (default 200)")
    p.add_argument("--concurrency", type=positive_int, default=16, metavar="C",
                   help="requests in flight at once (default 16)")
    p.add_argument("--tokens", type=positive_int, default=16, metavar="T", help="output tokens per request")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from deepserve.benchmarks.http import http_bench

    def progress(label: str) -> None:
        if not args.json:
            print(f"measuring {label} ...", file=sys.stderr, flush=True)

    title, rows = http_bench(args.requests, args.concurrency, args.tokens, progress)
    print(as_json_lines(rows) if args.json else render(title, rows))
    return 0
