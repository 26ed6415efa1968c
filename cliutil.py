"""Compatibility: the CLI helpers moved to `deepserve.cli.util` on main; modules written before the
move (benchmarks/sim_cli.py, adapters/scenario/cli.py) import them from here."""

from deepserve.cli.util import (
    CliError,
    CliParser,
    one_line,
    positive_int,
    print_json,
    print_pretty_json,
    seconds,
)

__all__ = ["CliError", "CliParser", "one_line", "positive_int", "print_json", "print_pretty_json", "seconds"]
