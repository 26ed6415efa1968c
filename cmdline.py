"""What code at any layer may share with the command line: the user-error exception, argparse
value types and JSON output.

It sits below every layer (stdlib and msgspec only) so that a layer that parses or prints for
a command (a scenario's flags, a benchmark's, `replay why`) needs nothing from `cli/`, which
nothing imports (DESIGN.md, Layout). `cli/util.py` keeps what only the command itself uses.
The contract for the command line (DESIGN.md): a bad argument exits 2 with one line on stderr
and never a traceback; `--json` prints results as JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

import msgspec


class CliError(Exception):
    """A user error: printed as one line on stderr, exit status 2 (cli/main.py)."""


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
