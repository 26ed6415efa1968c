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


def test_building_the_parser_imports_no_chart_library() -> None:
    """Every command builds the whole parser: `replay report`'s chart library (plotly, ~0.1 s
    of CPU to import) is imported when a report is drawn, not by `deepserve sim` (issue 31 §5)."""
    import subprocess
    import sys

    code = ("import sys; from deepserve.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'plotly'))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
