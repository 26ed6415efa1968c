"""The `deepserve` command: wires the command groups, owns error handling.

Each command group lives beside what it drives and registers itself on the
subparsers: `register(subparsers)` in `simcli` and `replay.cli`; optional groups
(`benchmarks/cli.py: register_bench`, `adapters/hardware/cli.py: register_hw`)
are added when their module exists. A command is a function `(args) -> int`
stored as `func` in its parser's defaults; its return value is the exit status.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sqlite3
import sys
from collections.abc import Sequence

from deepserve.cliutil import CliError, CliParser, one_line
from deepserve.core.driver import CODE_VERSION
from deepserve.persistence.api import LogError
from deepserve.replay.common import ReplayError

# (module, function) of command groups that other parts of the tree provide.
OPTIONAL_GROUPS = (
    ("deepserve.benchmarks.cli", "register_bench"),
    ("deepserve.adapters.hardware.cli", "register_hw"),
    ("deepserve.daemon.cli", "register_daemon"),
)

# Errors caused by what the user passed in (a path, a log, an argument): exit 2.
BAD_INPUT = (CliError, LogError, ReplayError, sqlite3.DatabaseError)
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3  # a bug in deepserve itself; 1 is reserved for "verify found a divergence"


def build_parser() -> CliParser:
    from deepserve import simcli
    from deepserve.replay import cli as replay_cli

    parser = CliParser(
        prog="deepserve",
        description="Serverless LLM serving as an event-logged actor system (see DESIGN.md).",
    )
    parser.add_argument("--version", action="version", version=f"deepserve {CODE_VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    simcli.register(sub)
    replay_cli.register(sub)
    for module_name, function in OPTIONAL_GROUPS:
        # find_spec, not try/import: an error *inside* an existing module must surface.
        if _module_exists(module_name):
            getattr(importlib.import_module(module_name), function)(sub)
    return parser


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BAD_INPUT as exc:
        print(f"deepserve: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("deepserve: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep the interpreter
        # from failing again while flushing stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 — the promise is: never a traceback
        if os.environ.get("DEEPSERVE_DEBUG"):
            raise
        print(
            f"deepserve: internal error: {type(exc).__name__}: {one_line(str(exc))} "
            f"(set DEEPSERVE_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
