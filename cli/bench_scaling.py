"""`deepserve bench scaling` (a suite of cli/bench.py; the bench is benchmarks/scaling.py): fast
scaling in emulated seconds, each row beside its baseline from the same run."""

from __future__ import annotations

import argparse

from deepserve.cmdline import CliError, print_json


def _rows(text: str) -> tuple[str, ...]:
    from deepserve.benchmarks.scaling import ROWS

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in ROWS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"unknown row set {bad[0] if bad else text!r}; known: {', '.join(ROWS)}")
    return names


def register(which: argparse._SubParsersAction) -> None:
    p = which.add_parser("scaling", help="fast scaling (DeepServe §6): 64 TEs pre-warmed + NPU-fork vs cold, per step")
    p.add_argument("--rows", type=_rows, metavar="A,B", help="row sets to run (default: all)")
    p.add_argument("--json", action="store_true", help="one JSON object per row (with per-step means)")
    p.add_argument("--log", metavar="DIR", default="",
                   help="also write each run's log into DIR (an existing directory): `replay state LOG --actor cluster`")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deepserve.benchmarks.scaling import ROWS, render

    if args.log and not Path(args.log).is_dir():
        raise CliError(f"--log: {args.log} is not a directory")
    rows = []
    try:
        for name in args.rows or tuple(ROWS):
            rows += ROWS[name](log_dir=args.log)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        for row in rows:
            print_json(row)
    else:
        print(render(rows))
    return 0
