"""`deepserve chaos SCENARIO --seeds N [--first-seed S] [--requests R] [--workers K]
[--cluster ADDRESS] [--set KEY=VALUE]... [--log-dir DIR] [--keep-logs] [--json]`

Seeded random fault schedules over the whole platform in virtual time, invariants checked
after every step (deepserve.chaos). Exit 0 when no seed violated an invariant, 1 when one did
(the seeds are listed, their logs kept), 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from deepserve.cli.util import CliError, CliParser, in_range, positive_int, print_json

MAX_SEEDS = 1_000_000
MAX_WORKERS = 1024
EXIT_VIOLATED = 1


def register(subparsers: Any) -> None:
    p: CliParser = subparsers.add_parser(
        "chaos", help="seeded random fault schedules over the platform, invariants checked every step",
        description="Run SCENARIO once per seed with a fault schedule drawn from the seed (NPU crashes, "
        "hangs, HBM faults, resets, link downs, degradations and flaps; overlapping), the control plane "
        "recovering, and check after every simulated step: every request reaches exactly one terminal "
        "state, no KV block is leaked or freed twice, no token is streamed twice or skipped; at the end "
        "the TE groups are back at their targets and the log replays identically. Exit 1 if a seed "
        "violated an invariant (each printed with its step; its log kept).",
    )  # fmt: skip
    p.add_argument("scenario", metavar="SCENARIO", help="a built-in scenario name, or a scenario or daemon TOML file (as `deepserve sim`)")
    p.add_argument("--seeds", type=in_range(int, 1, MAX_SEEDS, "a seed count"), required=True, metavar="N",
                   help="how many seeds to run")
    p.add_argument("--first-seed", type=in_range(int, 0, 2**63 - MAX_SEEDS, "a seed"), default=0, metavar="S",
                   help="run seeds S .. S+N-1 (default 0); `--seeds 1 --first-seed S` re-runs seed S")
    p.add_argument("--requests", type=positive_int, metavar="R",
                   help="requests per seed: the scenario trace's first R (default: the scenario's)")
    p.add_argument("--workers", type=in_range(int, 1, MAX_WORKERS, "a worker count"), default=None, metavar="K",
                   help="local processes running seeds (default: the machine's CPUs)")
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="run the seeds on a Ray cluster at ADDRESS ('local': a Ray instance on this machine); "
                        "needs the ray extra")  # fmt: skip
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field, e.g. cluster.tes=3 (repeatable)")
    p.add_argument("--log-dir", default="runs/chaos", metavar="DIR",
                   help="where seeds' logs go (default runs/chaos, created); a passing seed's is deleted")
    p.add_argument("--keep-logs", action="store_true", help="keep every seed's log, not only failing ones'")
    p.add_argument("--json", action="store_true", help="end with the summary as one JSON object")
    p.set_defaults(func=_chaos)


def _chaos(args: argparse.Namespace) -> int:
    from deepserve.adapters.scenario.loader import ScenarioError
    from deepserve.chaos import report
    from deepserve.chaos.platform import load_config
    from deepserve.chaos.pool import RayMissing, run_seeds

    if args.cluster is not None and args.workers is not None:
        raise CliError("--workers: local processes; with --cluster the Ray cluster decides (give one of them)")
    if args.cluster is not None and not args.cluster.strip():
        raise CliError("--cluster: expected a Ray address or 'local'")
    try:
        config = load_config(args.scenario, args.overrides)
    except ScenarioError as exc:
        raise CliError(str(exc)) from None
    try:
        os.makedirs(args.log_dir, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--log-dir {args.log_dir}: {exc.strerror}") from None
    if not os.path.isdir(args.log_dir):
        raise CliError(f"--log-dir {args.log_dir}: not a directory")
    workers = args.workers or os.cpu_count() or 1
    seeds = range(args.first_seed, args.first_seed + args.seeds)

    def progress(r: Any) -> None:
        if r.first is not None and not args.json:
            print(report.failure_line(r, args.scenario, args.requests, args.overrides), flush=True)

    try:
        results, wall = run_seeds(config, seeds, args.requests, args.log_dir, workers=workers,
                                  keep_logs=args.keep_logs, cluster=args.cluster, progress=progress)  # fmt: skip
    except RayMissing as exc:
        raise CliError(str(exc)) from None
    n = min(workers, len(seeds))
    backend = f"ray {args.cluster}" if args.cluster is not None else (f"{n} local processes" if n > 1 else "this process")
    s = report.summary(results, wall, backend)
    if args.json:
        for r in results:
            if r.first is not None:
                print(report.failure_line(r, args.scenario, args.requests, args.overrides), file=sys.stderr)
        print_json(s)
    else:
        print(report.text(s))
    return EXIT_VIOLATED if s["violations"] else 0
