"""The README's examples run exactly as written, and it says what a newcomer needs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cliproc import deepserve

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
    res = deepserve("--help", cwd=tmp_path)
    assert res.returncode == 0
    assert "DESIGN.md" not in res.stdout
    docs = re.findall(r"docs/([a-z-]+\.md)", res.stdout)
    assert docs, res.stdout
    for name in docs:
        assert (README.parent / "docs" / name).is_file(), name
