"""`make test` says it is alive: a test that keeps the suite silent longer than the limit gets a
progress line naming it (tests/progress_report.py; limit shortened here by its variable)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_slow.py").write_text(
        "import time\n\n"
        "def test_quick():\n    pass\n\n"
        "def test_slow():\n    time.sleep(1.5)  # the long test whose silence is reported\n"
    )
    env = {**os.environ, "DEEPSERVE_TEST_PROGRESS_S": "0.4", "PYTHONPATH": str(TESTS)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "progress_report", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, *args, "test_slow.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_silent_stretch_prints_what_is_running(tmp_path: Path) -> None:
    res = _pytest(tmp_path, "-n", "1")  # as `make test` runs: xdist's controller reports
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [line for line in res.stdout.splitlines() if line.startswith("[still running after")]
    assert any("running test_slow.py::test_slow (" in line for line in lines), res.stdout
