"""What only the `deepserve` command itself uses: its argument parser, the advice for a missing
optional dependency, the check for a log target's driver.

What code below `cli/` shares with the command line (`CliError`, the argparse value types,
`print_json`) is `deepserve.cmdline`: nothing imports `cli/` (DESIGN.md, Layout). The contract
for the command line (DESIGN.md): a bad argument exits 2 with one line on stderr and never a
traceback; `--json` prints results as JSON.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

# Re-exported: a command module may take the shared pieces from here or from cmdline.
from deepserve.cmdline import (  # noqa: F401
    CliError,
    in_range,
    positive_float,
    positive_int,
    print_json,
    print_pretty_json,
    seconds,
)


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
