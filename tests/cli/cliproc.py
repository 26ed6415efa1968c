"""Running `python -m deepserve` in a subprocess, and the one-line error contract."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def deepserve(*args: str, cwd: Path, hashseed: str = "0") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONHASHSEED": hashseed,
        "PYTHONPATH": os.pathsep.join([str(TESTS / "core"), str(TESTS / "replay")]),
    }
    env.pop("DEEPSERVE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "deepserve", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


def assert_one_line_error(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, exactly one line on stderr, no traceback; returns that line."""
    assert res.returncode == 2, (res.returncode, res.stdout[:500], res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
