"""The README's examples run exactly as written, it says what a newcomer needs, and its command
table and the command line's `--help` agree: every command in the table, every option it names
accepted, every option with its help text."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from cliproc import deepserve, in_process

from deepserve.cli.main import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_example_is_short_and_runs_as_written(tmp_path: Path) -> None:
    block = _python_blocks()[0]
    assert len(block.strip().splitlines()) <= 15
    script = tmp_path / "readme_example.py"
    script.write_text(block)
    res = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == "2.0 ['ada', 'alan']\n"


def test_readme_embedding_example_logs_and_verifies_from_the_cli(tmp_path: Path) -> None:
    """The logged example, run as the README says, then verified as the README says."""
    (tmp_path / "greet.py").write_text(_python_blocks()[1])
    res = subprocess.run(
        [sys.executable, "greet.py", "greet.db"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    claimed = re.search(r"replay verify greet.db --path \.\s+# (.*)", README.read_text())
    assert claimed is not None
    res = deepserve("replay", "verify", "greet.db", "--path", ".", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == claimed.group(1).strip()
    res = deepserve("replay", "state", "greet.db", "--actor", "greeter", "--path", ".", cwd=tmp_path)
    assert res.returncode == 0 and '"alan"' in res.stdout, res.stderr


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_readme_says_what_a_newcomer_needs() -> None:
    text = README.read_text()
    assert "Python ≥ 3.11" in text and "package index" in text
    assert ".venv/bin" in text and "PATH" in text
    assert "initdb" in text and "skipped" in text  # the PostgreSQL tests' requirement
    for name in ("open_sink", '"async"', '"outbox"', "sink=", "close()", "config=", "snapshot_every", "--path", "--import"):
        assert name in text, name


def test_help_points_to_docs_that_exist(tmp_path: Path) -> None:
    res = in_process("--help", cwd=tmp_path)
    assert res.returncode == 0
    assert "DESIGN.md" not in res.stdout
    docs = re.findall(r"docs/([a-z-]+\.md)", res.stdout)
    assert docs, res.stdout
    for name in docs:
        assert (README.parent / "docs" / name).is_file(), name


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every parser of the command tree by its path: ("replay", "why") -> `deepserve replay why`."""
    found = {path: parser}
    sub = _subcommands(parser)
    for name, child in (sub.choices.items() if sub is not None else ()):
        found.update(_commands(child, (*path, name)))
    return found


def _table_commands() -> list[str]:
    """The `deepserve ...` code spans of the README's command table's first column, `\\|` read as `|`."""
    spans = []
    for line in README.read_text().splitlines():
        if line.startswith("| `deepserve"):
            first_cell = re.split(r"(?<!\\)\|", line)[1]
            spans += [s.replace("\\|", "|") for s in re.findall(r"`(deepserve [^`]*)`", first_cell)]
    return spans


def _named(span: str, tree: dict[tuple[str, ...], argparse.ArgumentParser]) -> tuple[list[tuple[str, ...]], str]:
    """The commands a table entry names (`replay verify|log` is two) and the rest of it."""
    paths: list[tuple[str, ...]] = [()]
    words = span.split()[1:]
    while words and all(_subcommands(tree[p]) is not None for p in paths):
        alternatives = words.pop(0).split("|")
        paths = [(*p, a) for p in paths for a in alternatives]
        unknown = [" ".join(p) for p in paths if p not in tree]
        assert not unknown, f"the README's table names `deepserve {unknown[0]}`, which --help does not know"
    return paths, " ".join(words)


def test_the_readme_table_and_help_agree() -> None:
    tree = _commands(build_parser())
    leaves = {p for p, parser in tree.items() if p and _subcommands(parser) is None}
    listed: set[tuple[str, ...]] = set()
    for span in _table_commands():
        paths, rest = _named(span, tree)
        listed.update(paths)
        for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest):
            for p in paths:  # e.g. `replay migrate` takes no --run: it needs a row of its own
                assert option in tree[p]._option_string_actions, f"`deepserve {' '.join(p)}` has no {option} ({span})"
    missing = sorted(" ".join(p) for p in leaves - listed)
    assert not missing, f"commands missing from the README's table: {missing}"


def test_every_command_and_option_has_help() -> None:
    silent = []
    for path, parser in _commands(build_parser()).items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                silent += [f"{' '.join(path)} {a.dest}" for a in action._choices_actions if not a.help]
            elif not isinstance(action, argparse._HelpAction | argparse._VersionAction) and not action.help:
                silent.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
    assert not silent, f"without help text: {silent}"
