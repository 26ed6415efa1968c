"""A sink left open at exit is closed then, and a close that fails there is reported
(stderr, through structlog) and visible to a program that owns its exit status."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deepserve.core.records import InputRec, RunRec, Step
from deepserve.persistence import close_failures, close_open_sinks, open_log, open_sink

LEFT_OPEN = """
import sys
from deepserve.core.records import InputRec, RunRec, Step
from deepserve.persistence import open_sink

sink = open_sink(sys.argv[1], writer=sys.argv[2])
sink.begin_run(RunRec("r", "sim", 1, "{}", "v", "h", 0.0))
sink.append(Step(InputRec("a/1", 0, 0.0, 1, 0, "ext/x", 1, None, None, True, "M", b"ok"), (), ()))
if sys.argv[3] == "bad":  # a value neither SQLite nor msgpack takes: the last write fails
    sink.append(Step(InputRec("a/1", 1, 0.0, 2, 0, "ext/x", 2, None, None, True, "M", object()), (), ()))
print("done")  # stdout is the program's: the report must not land here
"""


def _run_left_open(path: str, writer: str, bad: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LEFT_OPEN), path, writer, bad],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_failed_close_at_exit_is_reported_on_stderr(tmp_path: Path, writer: str) -> None:
    path = str(tmp_path / "x.db")
    out = _run_left_open(path, writer, "bad")
    assert out.stdout == "done\n"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "log sink failed at close" in lines[0] and path in lines[0]
    assert "log writer failed" in lines[0]


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_sink_left_open_is_written_at_exit_silently(tmp_path: Path, writer: str) -> None:
    path = str(tmp_path / "ok.db")
    out = _run_left_open(path, writer, "good")
    assert (out.stdout, out.stderr) == ("done\n", "")
    with open_log(path) as log:
        assert [s.input.seq for s in log.steps()] == [0]


def test_close_open_sinks_returns_the_failure_for_the_exit_status(tmp_path: Path) -> None:
    path = str(tmp_path / "y.db")
    sink = open_sink(path)
    sink.begin_run(RunRec("r", "sim", 1, "{}", "v", "h", 0.0))
    bad = InputRec("a/1", 0, 0.0, 1, 0, "ext/x", 1, None, None, True, "M", object())  # type: ignore[arg-type]
    sink.append(Step(bad, (), ()))
    failed = close_open_sinks()
    assert len(failed) == 1 and failed[0].startswith(f"{path}: log writer failed")
    assert failed[0] in close_failures()
    assert close_open_sinks() == []  # closed now: nothing left to report
