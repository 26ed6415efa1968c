"""The `deepserve` command: the table of its commands, and the error handling they share.

Each command group is a module of this package with a `register(subparsers)` that adds its
parsers; `COMMANDS` lists them, one row each, in the order `deepserve --help` shows them. A
command is a function `(args) -> int` stored as `func` in its parser's defaults; its return value
is the exit status. The layers below (daemon/, benchmarks/, replay/, ...) do the work and never
import this package (DESIGN.md, Layout; tests/test_layers.py).
"""

from __future__ import annotations

import gc
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Any

from deepserve.cli import bench, chaos, daemon, hw, profile, replay, sim
from deepserve.cli.util import CliParser, missing_extra, one_line
from deepserve.cmdline import CliError
from deepserve.core.driver import CODE_VERSION
from deepserve.persistence import close_open_sinks
from deepserve.persistence.api import LogError
from deepserve.replay.common import ReplayError

# Errors caused by what the user passed in (a path, a log, an argument), and a log that
# could not be written: exit 2.
BAD_INPUT = (CliError, LogError, ReplayError, sqlite3.DatabaseError)
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3  # a bug in deepserve itself; 1 is reserved for "verify found a divergence"


Register = Callable[[Any], None]

# Every command of `deepserve`: the names it adds and the function that adds their parsers.
COMMANDS: tuple[tuple[tuple[str, ...], Register], ...] = (
    (("sim",), sim.register),
    (("replay",), replay.register),
    (("bench",), bench.register),
    (("hw",), hw.register),
    (("chaos",), chaos.register),
    (("profile",), profile.register),
    (("up", "config", "status", "fault", "scale"), daemon.register),
)


def build_parser() -> CliParser:
    parser = CliParser(
        prog="deepserve",
        description="Serverless LLM serving as an event-logged actor system. Documentation: "
        "README.md and docs/ in the source tree (docs/kernel.md: actors, the log, replay).",
    )
    parser.add_argument("--version", action="version", version=f"deepserve {CODE_VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for _, register in COMMANDS:
        register(sub)
    return parser


# The cyclic GC's first threshold for the command's process (CPython's default: 700). A
# simulation allocates and frees containers by the million; at 700 the collector ran ~400
# times over the first 2,000 Mooncake requests (0.49 s of ~5 s, measured with gc.callbacks),
# at 10,000 ~120 times (0.25 s). Only the CLI's own process: an embedding program keeps its
# settings.
GC_GEN0_THRESHOLD = 10_000


def main(argv: Sequence[str] | None = None) -> int:
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
    args = build_parser().parse_args(argv)
    status = _run(args)
    # A log sink still open (a command's, or one opened by user code loaded with
    # --import) is closed now, while the exit status can still say that its last
    # writes were lost: by atexit time it is fixed. persistence reports each failure
    # on stderr, one line.
    if close_open_sinks() and status == 0:
        status = EXIT_BAD_INPUT
    if argv is None:  # the program's own command line: the process ends with this command
        # What the command built and dropped (a simulation's actors, their states, the JE's
        # prompt trees) is left to the OS: the interpreter's exit would walk and free it all
        # in a last collection (~0.2 s of CPU after a 4,000-request `sim`, measured). Frozen,
        # that collection skips it. Not for a caller that passes argv and lives on.
        gc.freeze()
    return status


def _run(args: Any) -> int:
    try:
        return int(args.func(args))
    except BAD_INPUT as exc:
        print(f"deepserve: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModuleNotFoundError as exc:
        advice = missing_extra(exc.name)
        if advice is None:
            return _internal_error(exc)
        print(f"deepserve: error: {advice}", file=sys.stderr)
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
        return _internal_error(exc)


def _internal_error(exc: Exception) -> int:
    if os.environ.get("DEEPSERVE_DEBUG"):
        raise exc
    print(
        f"deepserve: internal error: {type(exc).__name__}: {one_line(str(exc))} "
        f"(set DEEPSERVE_DEBUG=1 for the traceback)",
        file=sys.stderr,
    )
    return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
