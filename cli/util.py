"""What every `deepserve` command shares: the argument parser and output helpers.

The contract for the command line (DESIGN.md): a bad argument exits 2 with one
line on stderr and never a traceback; `--json` prints results as JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import msgspec


class CliError(Exception):
    """A user error: printed as one line on stderr, exit status 2."""


class CliParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block), so scripts and
    humans see exactly what was wrong. Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


# Optional dependencies by module: what needs it, and the extra that installs it.
EXTRAS = {"asyncpg": ("PostgreSQL logs", "postgres"), "pykka": ("the Pykka baseline", "bench")}


def missing_extra(name: str | None) -> str | None:
    """The one-line advice for a missing optional module, or None if it is not one."""
    if name not in EXTRAS:
        return None
    what, extra = EXTRAS[name]
    return f"{what} need the {name} package, not installed: pip install 'deepserve[{extra}]'"


def require_driver(target: str) -> None:
    """Refuse a PostgreSQL log target up front when its driver is not installed."""
    scheme = target.partition("://")[0].lower() if "://" in target else ""
    if not scheme.startswith("postgres"):
        return
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        raise CliError(f"{_no_password(target)}: {missing_extra('asyncpg')}") from None


def _no_password(url: str) -> str:
    head, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{head}{sep}{userinfo.split(':', 1)[0]}:***@{host}"


def one_line(text: str) -> str:
    return " ".join(text.split())


def seconds(text: str) -> float:
    """argparse type for a clock time or duration in seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds as a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type for a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def in_range(kind: type[int] | type[float], lo: float, hi: float, what: str) -> Callable[[str], Any]:
    """argparse type for an int or float from `lo` to `hi` ("must be WHAT from LO to HI")."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be {what} from {lo:g} to {hi:g}, got {text!r}")
        return value

    return parse


def print_json(obj: Any) -> None:
    """One JSON document per line: easy to pipe into jq or read line by line."""
    sys.stdout.write(msgspec.json.encode(obj, enc_hook=repr).decode() + "\n")


def print_pretty_json(obj: Any) -> None:
    blob = msgspec.json.encode(obj, enc_hook=repr)
    sys.stdout.write(msgspec.json.format(blob, indent=2).decode() + "\n")
