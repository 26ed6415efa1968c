"""`deepserve bench recovery` (a suite of cli/bench.py); the bench is benchmarks/recovery.py."""

from __future__ import annotations

import argparse
import sys

from deepserve.cmdline import positive_int

# benchmarks/recovery.py's FAULTS, RUNGS and SETTINGS (a test keeps them equal): named here so that
# building the parser imports no cluster
FAULT_NAMES = ("npu-crash", "npu-hang", "hbm-fault", "link-down", "kv-saturation", "link-transient",
               "te-process-kill", "dp-npu-crash", "colo-npu-crash", "colo-process-kill")  # fmt: skip
RUNG_NAMES = ("replace", "restart-world", "pd-separate", "substitute", "migrate", "token-recompute", "hbm-mask",
              "link-probe", "link-route", "reroute", "migrate-kv")  # fmt: skip


def _choices(known: tuple[str, ...], what: str) -> object:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(x.strip() for x in text.split(",") if x.strip())
        bad = [n for n in names if n not in known]
        if not names or bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad[0] if bad else text!r}; known: {', '.join(known)}")
        return names

    return parse


def register(which: argparse._SubParsersAction) -> None:
    p = which.add_parser("recovery", help="each fault kind under each rung of the recovery ladder: detection, "
                                          "recovery, requests failed/migrated/recomputed (issue 33)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object: the workload and one row a cell")
    p.add_argument("--requests", type=positive_int, default=200, metavar="N",
                   help="the first N requests of the Azure conversation trace (default 200)")
    p.add_argument("--seed", type=int, default=0, help="the run seed, the same for every cell (default 0)")
    p.add_argument("--faults", type=_choices(FAULT_NAMES, "fault"), metavar="A,B",
                   help=f"fault kinds (default: all: {', '.join(FAULT_NAMES)})")
    p.add_argument("--rungs", type=_choices(RUNG_NAMES, "rung"), metavar="A,B",
                   help=f"ladder rungs (default: all that apply: {', '.join(RUNG_NAMES)})")
    p.add_argument("--stream", action="store_true",
                   help="clients stream (a streamed request on a failed TE fails, or moves on with rung "
                        "migrate); default: one body at the end, so a failed task is run again")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import msgspec

    from deepserve.benchmarks.recovery import DECODE, FAULT_AT_S, PREFILL, render, run_table
    from deepserve.cmdline import print_json

    faults = args.faults or FAULT_NAMES
    rungs = args.rungs or RUNG_NAMES
    if not args.json:
        print(f"measuring {len(faults)} faults x the rungs that apply ...", file=sys.stderr, flush=True)
    cells = run_table(faults, args.requests, args.seed, rungs, args.stream)
    if args.json:
        print_json({"workload": {"cluster": f"{PREFILL}P{DECODE}D llama3-8b 910b roce, 1 spare server",
                                 "trace": "builtin:azure_conv_500", "requests": args.requests, "seed": args.seed,
                                 "stream": args.stream, "fault_at_s": FAULT_AT_S, "target": f"te/{PREFILL}",
                                 "baseline": "replace"},
                    "rows": [msgspec.to_builtins(c) for c in cells]})  # fmt: skip
    else:
        print(render(cells))
    return 0
