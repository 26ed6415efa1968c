"""Crash durability: whatever `on_commit` reported before a SIGKILL is in the log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from deepserve.persistence import open_log

CHILD = r"""
import os, sys, time
from deepserve.core.records import EventRec, InputRec, OutputRec, RunRec, Step
from deepserve.persistence import open_sink

sink = open_sink(sys.argv[1], sys.argv[2])
sink.on_commit = lambda t: os.write(1, b"%d\n" % t)  # from the writer thread, after COMMIT
sink.begin_run(RunRec("crash", "daemon", 0, "{}", "0", "h", 0.0))
i = 0
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    i += 1
    sink.append(Step(
        InputRec("a/1", i, float(i), i, 0, "ext/x", i, f"c{i % 7}", None, True, "T", b"x" * 64),
        [EventRec("a/1", i, 0, "E", b"e")],
        [OutputRec("a/1", i, 0, 0, "b/1", i, 0.0, None, None, None, False, "M", b"m")],
    ))
    if sys.argv[3] == "exit" and i == 3000:
        sys.exit(0)  # no close(): the atexit hook must still write the queue
    if i % 200 == 0:
        time.sleep(0.0005)  # let commits and appends interleave
"""


def _child(path: Path, durability: str, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), durability, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_sigkill_loses_no_reported_commit(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    proc = _child(path, "outbox", "run")
    reported: list[int] = []
    assert proc.stdout is not None
    start = time.monotonic()
    while len(reported) < 10 or reported[-1] < 20_000:
        line = proc.stdout.readline()
        assert line, f"child died: {proc.stderr.read().decode() if proc.stderr else ''}"
        reported.append(int(line))
        assert time.monotonic() - start < 15
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=10)
    reported += [int(x) for x in rest.split()]  # printed before the kill: also committed
    assert proc.returncode == -signal.SIGKILL
    assert reported == sorted(reported)

    log = open_log(str(path))  # recovers the -wal left behind
    seqs = [s.input.seq for s in log.steps()]
    assert len(seqs) >= reported[-1]
    assert seqs == list(range(1, len(seqs) + 1))  # a prefix of the appends: no holes
    last = list(log.steps(corr="c3"))[-1]
    assert (last.events[0].seq, last.outputs[0].dst) == (last.input.seq, "b/1")


def test_exit_without_close_still_writes_everything(tmp_path: Path) -> None:
    path = tmp_path / "exit.db"
    proc = _child(path, "async", "exit")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()
    assert sum(1 for _ in open_log(str(path)).steps()) == 3000
