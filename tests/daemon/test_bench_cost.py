"""`bench http`'s cost rows: the readings they are made of (/proc CPU and RSS of a process, a live
log's bytes) and their flags (a bad value is one line and exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from deepserve.benchmarks.http_cost import cpu_s, log_bytes, rss_kb
from deepserve.core.records import InputRec, RunRec, Step
from deepserve.persistence import open_sink


def test_cpu_and_rss_of_a_process_are_read_from_proc() -> None:
    before = cpu_s(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert cpu_s(os.getpid()) - before >= 0.03
    assert rss_kb(os.getpid()) > 1000


def test_log_bytes_grow_with_what_is_committed(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    sink = open_sink(str(db))
    sink.begin_run(RunRec("r", "daemon", 0, "{}", "v", "h", 0.0))
    sink.flush()
    empty = log_bytes(db)
    for i in range(1, 2001):
        sink.append(Step(InputRec("a/1", i, float(i), i, 0, "ext/x", i, None, None, True, "T", os.urandom(100)), (), ()))
    sink.flush()
    # (random payloads: the log's zstd pages cannot shrink them) read while the writer holds the file (WAL)
    assert log_bytes(db) - empty > 2000 * 100
    sink.close()


def test_bad_cost_flags_are_one_line_and_exit_2() -> None:
    for flag, value in (("--cost-rounds", "-1"), ("--idle-s", "nan"), ("--cost-requests", "0"), ("--warm-up", "0")):
        r = subprocess.run([sys.executable, "-m", "deepserve", "bench", "http", flag, value],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        assert r.returncode == 2, (flag, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and flag in r.stderr, r.stderr
