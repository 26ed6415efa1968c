"""Making the user's own actor classes loadable by `deepserve replay`.

Replay rebuilds an actor from its logged class path "module:QualName" (a class of a
script run as `__main__` is logged under the script's importable name, see
`core.actor.class_path`). `--path DIR` puts the directory of that module first on the
import path; `--import MODULE` imports a module before the log is read, for message
and event types defined outside the actor's module. A class path read from a log may
import only modules found in those directories (or on PYTHONPATH), under those imported
modules, or deepserve's own: a log is data (`core.classpath.load_logged_class`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from deepserve.cli.util import CliParser
from deepserve.cmdline import CliError
from deepserve.core.classpath import trust_directory, trust_module


def add_user_code_arguments(p: CliParser) -> None:
    p.add_argument(
        "--path", action="append", default=[], metavar="DIR",
        help="look for your actor modules in DIR first (repeatable)",
    )
    p.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="import MODULE before reading: your actor, message and event classes (repeatable)",
    )


def load_user_code(args: argparse.Namespace) -> None:
    for directory in reversed(args.path):
        if not os.path.isdir(directory):
            raise CliError(f"--path {directory}: no such directory")
        sys.path.insert(0, os.path.abspath(directory))
        trust_directory(directory)  # the log's class paths may import modules found there
    for module in args.imports:
        _import(module)
        trust_module(module)


def _import(module: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            raise CliError(
                f"--import {module}: no module named {exc.name!r} (add its directory with --path DIR)"
            ) from None
        raise CliError(f"--import {module}: importing it failed: {exc}") from None
    except SystemExit as exc:  # its exit status must not pass for replay's own (1: diverged)
        raise CliError(f"--import {module}: importing it exited (sys.exit) with status {exc.code!r}") from None
    except Exception as exc:  # noqa: BLE001 — user code: any error is one line of bad input
        raise CliError(f"--import {module}: importing it raised {type(exc).__name__}: {exc}") from None
