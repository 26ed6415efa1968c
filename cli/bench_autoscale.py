"""`deepserve bench autoscale` (a suite of cli/bench.py); the bench is benchmarks/autoscale.py."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from deepserve.cmdline import print_json


def row_list(text: str) -> tuple[str, ...]:
    from deepserve.benchmarks.autoscale import ROWS

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in ROWS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"unknown row {bad[0] if bad else text!r}; known: {', '.join(ROWS)}")
    return names


def register(which: argparse._SubParsersAction) -> None:
    p = which.add_parser("autoscale", help="issue-34 autoscaling: burst SLO, P/D ratio goodput, role switching, "
                                           "each beside its baseline from the same run")  # fmt: skip
    p.add_argument("--rows", type=row_list, metavar="A,B", help="rows to run (default: all)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from deepserve.benchmarks.autoscale import ROWS, run

    rows = run(args.rows or tuple(ROWS))
    if args.json:
        print_json({"rows": [msgspec.to_builtins(r) for r in rows]})
        return 0
    for r in rows:
        print(_line(r))
    return 0


def _line(r: Any) -> str:
    detail = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.detail.items())
    return f"{r.name:<28} {r.value:>8.3f}  baseline {r.baseline:>8.3f}  {r.unit}  ({detail})"
