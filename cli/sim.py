"""`deepserve sim SCENARIO [--seed N] [--requests N] [--log PATH] [--json]`

FlowServe scenarios (built-in names and TOML files, with --trace and --set) are run by
`deepserve.cli.sim_scenario` (on the whole platform, `deepserve.cluster`); this module keeps the kernel's own example scenarios."""

from __future__ import annotations

import argparse
import importlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deepserve.cli import sim_scenario as scenario_cli
from deepserve.cli.util import CliParser, require_driver
from deepserve.cmdline import CliError, positive_int, print_json
from deepserve.persistence.api import LogError

# name -> ("module:function", one-line description). The function is
# `run(seed, sink, requests) -> summary dict`; imported only when chosen.
SCENARIOS: dict[str, tuple[str, str]] = {
    "example": (
        "deepserve.examples.pipeline:run_scenario",
        "a dispatcher, flaky workers, timeouts, a stop and a spawn (no LLM)",
    ),
}


def register(subparsers: Any) -> None:
    known = ", ".join(f"{name} ({desc})" for name, (_, desc) in SCENARIOS.items())
    p: CliParser = subparsers.add_parser(
        "sim",
        help="run a scenario in virtual time and write its log",
        description=f"Run a scenario in virtual time and write its log. Scenarios: {known}.",
    )
    p.add_argument("scenario", metavar="SCENARIO",
                   help=f"one of: {', '.join([*SCENARIOS, *scenario_cli.builtin_names()])}, or a TOML file")
    p.add_argument("--seed", type=seed, default=None,
                   help="run seed, a 64-bit signed integer (default: the scenario's; 0)")
    p.add_argument("--requests", type=positive_int, metavar="N",
                   help=f"jobs or requests to run (example: at most {MAX_EXAMPLE_JOBS:,}; "
                        "a trace scenario: at most the trace's rows)")  # fmt: skip
    p.add_argument(
        "--log", metavar="PATH",
        help="log file, in an existing directory (default runs/<scenario>-<seed>.db, runs/ "
        "created if needed; an existing log is replaced), a PostgreSQL URL, or none (no log)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    scenario_cli.add_arguments(p)
    p.set_defaults(func=_sim)


# A limit on everything: the example injects its whole job schedule up front and prints nothing
# until the end, so `--requests 100000000` ran on with no sign of life while memory grew. 10**5
# jobs took 6.6 s and 80 MB max RSS (`--log none`, one core, 2026-11-29): 10**6 is about a minute.
MAX_EXAMPLE_JOBS = 1_000_000

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # stored as a 64-bit signed integer


def seed(text: str) -> int:
    """argparse type for a run seed: an integer that fits the log's 64-bit column."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not SEED_MIN <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be between -2**63 and 2**63-1, got {text}")
    return value


def _scenario(name: str) -> Callable[..., dict[str, Any]]:
    if name not in SCENARIOS:
        known = ", ".join([*SCENARIOS, *scenario_cli.builtin_names()])
        if Path(name).is_dir():
            raise CliError(f"{name} is a directory; SCENARIO is a built-in name ({known}) or a TOML file")
        raise CliError(f"unknown scenario {name!r}; known scenarios: {known}, or a TOML file")
    module, _, function = SCENARIOS[name][0].partition(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


def _sim(args: argparse.Namespace) -> int:
    if args.scenario not in SCENARIOS and scenario_cli.handles(args.scenario):
        return scenario_cli.run(args, lambda path: _prepare(path, create_parent=args.log is None))
    if args.trace or args.overrides:
        raise CliError(f"--trace and --set apply to FlowServe scenarios, not {args.scenario!r}")
    args.seed = 0 if args.seed is None else args.seed
    run = _scenario(args.scenario)
    if args.requests is not None and args.requests > MAX_EXAMPLE_JOBS:
        raise CliError(f"--requests {args.requests}: scenario {args.scenario!r} runs at most "
                       f"{MAX_EXAMPLE_JOBS:,} jobs")  # fmt: skip
    target = args.log or f"runs/{args.scenario}-{args.seed}.db"
    sink = None
    if target != scenario_cli.NO_LOG:  # `--log none`: no log, as for FlowServe scenarios
        require_driver(target)
        if "://" not in target:  # a database URL is the store's business, not a file to replace
            # Only our own default directory is created: a typo in --log must not grow a tree.
            _prepare(Path(target), create_parent=args.log is None)
        # The writer process: the run ends with close(), and logging stays off the driver's core.
        from deepserve.persistence import open_sink  # (here: building the parser need not load it)

        sink = open_sink(target, "async", writer="process")
    t0 = time.perf_counter()
    try:
        summary = run(args.seed, sink, args.requests)
    finally:
        if sink is not None:
            sink.close()
    wall = time.perf_counter() - t0
    summary["wall_s"] = round(wall, 3)
    summary["log"] = target
    if args.json:
        print_json(summary)
    else:
        _print_summary(summary)
    return 0


def _prepare(path: Path, *, create_parent: bool) -> None:
    """Make room for a fresh log — but never delete a file that is not one."""
    if create_parent:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(f"cannot create {path.parent}: {exc.strerror}") from None
    elif not path.parent.is_dir():
        raise CliError(f"--log {path}: no such directory {path.parent} (create it first)")
    if path.is_dir():
        raise CliError(f"--log {path} is a directory")
    if not path.exists():
        return
    from deepserve.persistence import open_log

    try:
        open_log(str(path)).close()
    except LogError:
        raise CliError(f"{path} exists and is not a deepserve log; not replacing it") from None
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def _print_summary(summary: dict[str, Any]) -> None:
    width = max(len(k) for k in summary)
    for key, value in summary.items():
        if key != "log":
            print(f"{key.replace('_', ' '):>{width}}  {value}")
    print(f"log: {summary['log']}")
