"""The SQLite step reader's process: used for whole runs only, byte-identical to the
in-process path, and never left behind — finished, abandoned, failed or killed."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from store_testdata import encoded, expected, force_reader_process, run_rec

from deepserve.core.records import EventRec, InputRec, Step
from deepserve.persistence import LogError, open_log, open_sink
from deepserve.persistence.rows import input_crc
from deepserve.persistence.schema import INPUT_FIELDS
from deepserve.persistence.sqlite import log_reader as sqlite_reader
from deepserve.persistence.sqlite import process_reader as procread
from deepserve.persistence.sqlite.files import read_only_uri
from deepserve.persistence.sqlite.process_reader import ReaderProcess, live_readers


def _write(target: str, requests: int = 300, run_id: str | None = None) -> list[Step]:
    run, steps = expected(requests=requests, run_id=run_id)
    with open_sink(target, layout="rows") as sink:
        sink.begin_run(run)
        for s in steps:
            sink.append(s)
    return steps


def _bulky(path: str, n: int = 600) -> None:
    """~4 KiB a step: several times what the pipe holds."""
    blob = os.urandom(2048)
    with open_sink(path, layout="rows") as sink:
        sink.begin_run(run_rec("bulky"))
        for i in range(n):
            inp = InputRec("a/1", i, i * 0.5, i, 0, "x/1", i, None, None, False, "M", blob)
            sink.append(Step(inp, [EventRec("a/1", i, 0, "E", blob)], []))


def _the_reader() -> ReaderProcess:
    [reader] = list(procread._live)
    return reader


def test_a_whole_run_goes_through_the_process_and_it_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "run.db")
    steps = _write(path)
    with open_log(path) as log:
        in_process = encoded(list(log.steps()))  # thresholds not forced: in-process
        assert live_readers() == 0
        force_reader_process(monkeypatch, lead=10)
        it = log.steps()
        head = [next(it) for _ in range(3)]
        reader = _the_reader()
        got = encoded(head + list(it))
    assert got == in_process == encoded(steps)
    assert live_readers() == 0 and reader._proc.returncode == 0


def test_filters_and_short_runs_stay_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "run.db")
    steps = _write(path)
    with open_log(path) as log:
        it = log.steps()  # a few hundred steps: below PREFETCH_MIN_STEPS
        next(it)
        assert live_readers() == 0
        force_reader_process(monkeypatch)
        for filters in ({"actor": "log/0"}, {"corr": "req-3"}, {"since": 1.0}, {"until": 9.0}):
            it = log.steps(**filters)
            next(it)
            assert live_readers() == 0, filters
        assert len(list(log.steps(since=1.0))) == sum(s.input.t >= 1.0 for s in steps)


def test_abandoned_iterators_stop_their_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "bulky.db")
    _bulky(path)
    force_reader_process(monkeypatch)
    with open_log(path) as log:
        it = log.steps()
        [next(it) for _ in range(5)]  # past the lead: from the process, which is blocked
        reader = _the_reader()
        assert reader._proc.poll() is None
        it.close()
        assert reader._proc.returncode is not None and live_readers() == 0
        for step in log.steps():  # a consumer that stops early, as verify at a divergence
            if step.input.seq == 50:
                break
        assert live_readers() == 0
        it = log.steps()
        next(it)
    assert live_readers() == 0  # closing the log stops its readers
    with pytest.raises(LogError, match="closed"):
        list(it)


def test_at_most_max_readers_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "run.db")
    steps = _write(path)
    force_reader_process(monkeypatch)
    monkeypatch.setattr(sqlite_reader, "MAX_READERS", 1)
    with open_log(path) as log:
        a, b = log.steps(), log.steps()
        first = [next(a), next(b)]
        assert live_readers() == 1  # the second reads in-process
        assert encoded(first[:1] + list(a)) == encoded(first[1:] + list(b)) == encoded(steps)


def test_a_killed_reader_is_a_log_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "bulky.db")
    _bulky(path)
    force_reader_process(monkeypatch)
    with open_log(path) as log:
        it = log.steps()
        [next(it) for _ in range(5)]
        os.kill(_the_reader().pid, signal.SIGKILL)
        with pytest.raises(LogError) as info:
            list(it)
    assert str(info.value) == (
        f"{path}: the log reader process exited unexpectedly (killed by signal 9)"
    )
    assert live_readers() == 0


def test_sqlite_errors_in_the_process_are_one_line_log_errors(tmp_path: Path) -> None:
    path = str(tmp_path / "run.db")
    _write(path, requests=5)
    cfg: dict[str, Any] = {
        "uri": read_only_uri(path),
        "timeout": 1.0,
        "sql": "SELECT nope FROM inputs",
        "params": [],
        "kids": [],
        "size": 10,
        "frame_bytes": 1 << 20,
    }
    reader = ReaderProcess(path, cfg)
    try:
        with pytest.raises(LogError) as info:
            list(reader.steps())
    finally:
        reader.stop()
    assert str(info.value) == f"{path}: SQLite error: no such column: nope"


def test_corrupt_pages_met_by_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bitrot.db"
    _bulky(str(path), n=2000)
    force_reader_process(monkeypatch)
    log = open_log(str(path))
    it = log.steps()
    [next(it) for _ in range(5)]  # the process is on its first pages, blocked on the pipe
    reader = _the_reader()
    size = path.stat().st_size
    with open(path, "r+b") as f:  # pages from the middle on, not read yet, become noise
        f.seek(size // 2 // 4096 * 4096)
        f.write(b"\x0d\xff" * (size // 5))
    with pytest.raises(LogError) as info:
        list(it)
    log.close()
    assert str(info.value) == (
        f"{path}: corrupt SQLite file (database disk image is malformed)"
    )
    assert reader._proc.returncode == 1 and live_readers() == 0  # it reported, then exited


def test_directory_merge_through_reader_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("te-0", "te-1"):
        run, steps = expected(requests=200, run_id="daemon")
        with open_sink(str(tmp_path), process=name, layout="rows") as sink:
            sink.begin_run(run)
            for s in steps:
                sink.append(s)
    with open_log(str(tmp_path)) as log:
        want = encoded(list(log.steps()))
        force_reader_process(monkeypatch)
        it = log.steps()
        head = [next(it)]
        assert live_readers() == 2
        assert encoded(head + list(it)) == want
    assert live_readers() == 0


@pytest.mark.parametrize("through", ["this process", "the reader process"])
def test_a_row_that_makes_no_record_is_a_log_error(
    through: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "run.db")
    _write(path)
    c = sqlite3.connect(path)  # SQLite keeps text in an integer column
    c.execute("UPDATE inputs SET seq = 'many' WHERE id = 200")
    # ... and the row's checksum agrees (written so, not damaged since): the record check
    # is what refuses it
    row = c.execute(f"SELECT {', '.join(INPUT_FIELDS)} FROM inputs WHERE id = 200").fetchone()
    n = [c.execute(f"SELECT count(*) FROM {t} WHERE step_id = 200").fetchone()[0]
         for t in ("events", "outputs", "snapshots")]  # fmt: skip
    c.execute("UPDATE inputs SET crc32 = ? WHERE id = 200", (input_crc(200, row, n[0], n[1], n[2] > 0),))
    c.commit()
    c.close()
    if through == "the reader process":
        force_reader_process(monkeypatch)
    with open_log(path) as log, pytest.raises(LogError) as info:
        list(log.steps())
    want = re.escape(f"{path}: a step's rows do not fit the log's record types ")
    # the step's position is within its chunk or frame
    assert re.fullmatch(
        want + r"\(Expected `int`, got `str` - at `\$\[\d+\]\[0\]\[1\]`\)", str(info.value)
    )
