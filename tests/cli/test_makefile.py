"""`make` checks the interpreter first and rebuilds a broken `.venv` by itself.

Before: with Python 3.10, `make` failed inside pip and left a `.venv` that the next
`make` did not repair. The checks run `make -n` (print, do not run) or stop before
anything is created, so no test installs packages.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _make(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_an_old_python_is_refused_in_one_line_before_anything_is_made(tree: Path) -> None:
    old = tree / "python3.10"
    old.write_text('#!/bin/sh\ncase "$1" in -V) echo "Python 3.10.12";; *) exit 1;; esac\n')
    old.chmod(0o755)
    res = _make(tree, "setup", f"PYTHON={old}")
    assert res.returncode != 0
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert "needs Python >= 3.11" in lines[0] and "Python 3.10.12" in lines[0]
    assert not (tree / ".venv").exists()


def test_a_missing_python_is_named(tree: Path) -> None:
    res = _make(tree, "setup", "PYTHON=no-such-python-here")
    assert res.returncode != 0
    assert res.stderr.count("\n") == 1 and "no-such-python-here is not found" in res.stderr


def test_a_broken_venv_is_rebuilt(tree: Path) -> None:
    bin_dir = tree / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(tree / "gone" / "python3.10")  # its interpreter was removed
    (tree / ".venv" / ".installed").touch()  # even if an install once finished
    res = _make(tree, "-n", "setup", f"PYTHON={sys.executable}")
    assert res.returncode == 0, res.stderr
    plan = res.stdout
    assert "rm -rf .venv" in plan and f"{sys.executable} -m venv .venv" in plan
    assert plan.index("-m venv") < plan.index("pip install -q -e")


def test_a_working_venv_is_left_alone() -> None:
    if not (ROOT / ".venv" / ".installed").exists():
        pytest.skip("this checkout has no installed .venv")
    res = _make(ROOT, "-n", "setup")
    assert res.returncode == 0, res.stderr
    assert "-m venv" not in res.stdout and "rm -rf" not in res.stdout, res.stdout


def test_make_test_prints_why_postgres_tests_skip(tmp_path: Path) -> None:
    """Run one PostgreSQL test the way `make test` runs pytest, with no PostgreSQL
    binaries on PATH: the skip reason is one line of the output."""
    flags = re.search(r"\$\(PY\) -m pytest(.*)", (ROOT / "Makefile").read_text())
    assert flags is not None
    test = "tests/replay/test_verify_live.py::test_log_left_by_kill_9_verifies_postgres"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", *flags.group(1).split(), "-p", "no:cacheprovider", test],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": str(tmp_path)},
    )
    assert res.returncode == 0, res.stdout[-2000:]
    reasons = [line for line in res.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(reasons) == 1 and "PostgreSQL server binaries not on PATH" in reasons[0], res.stdout
