"""Commands register from one place: cli/main.py's `COMMANDS`, each row a register function of a
module of cli/ (issue 31 §6); the layers below never add a parser of their own."""

from __future__ import annotations

import argparse

from deepserve.cli.main import COMMANDS, build_parser


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(action.choices)


def test_the_parser_holds_the_table_s_commands_in_its_order() -> None:
    assert _subcommands(build_parser()) == [name for names, _ in COMMANDS for name in names]


def test_every_command_registers_from_a_module_of_cli() -> None:
    for names, register in COMMANDS:
        assert register.__module__.startswith("deepserve.cli."), (names, register.__module__)


def test_each_bench_suite_registers_from_cli() -> None:
    (bench,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    suites = bench.choices["bench"]
    (which,) = [a for a in suites._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(which.choices) == ["kernel", "sim", "policies", "transport", "devices", "routing", "http", "recovery",
                                   "scaling", "autoscale", "replay"]  # fmt: skip
    for name, parser in which.choices.items():
        func = parser.get_default("func")
        assert func.__module__.startswith("deepserve.cli."), (name, func.__module__)
