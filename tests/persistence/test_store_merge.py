"""A daemon run directory: one SQLite file per process, read as one log merged by HLC."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_testdata import encoded, run_rec

from deepserve.core.records import InputRec, SnapshotRec, Step
from deepserve.persistence import LogError, open_log, open_sink


def _step(actor: str, seq: int, hlc: int, corr: str = "c", snap: bool = False) -> Step:
    inp = InputRec(actor, seq, hlc / 10, hlc, 0, "x/1", seq, corr, None, False, "M", b"%d" % hlc)
    return Step(inp, (), (), SnapshotRec(actor, seq, "m:S", b"s") if snap else None)


def _write(
    directory: Path, process: str, steps: list[Step], run_id: str = "daemon-1", at: float = 1.0
) -> None:
    with open_sink(str(directory), process=process) as sink:
        sink.begin_run(run_rec(run_id, process=process, started_at=at))
        for s in steps:
            sink.append(s)


def test_merge_by_hlc_ties_by_file_name_then_insertion(tmp_path: Path) -> None:
    # te-0's own stream is not HLC-sorted (two actors, two clocks): it stays in order.
    te0 = [
        _step("je/0", 1, 10),
        _step("je/0", 2, 30),
        _step("rtc/0", 1, 20, snap=True),
        _step("je/0", 3, 40),
    ]
    te1 = [_step("te/1", 1, 15), _step("te/1", 2, 30, corr="k"), _step("te/1", 3, 35)]
    _write(tmp_path, "te-1", te1)
    _write(tmp_path, "te-0", te0)
    log = open_log(str(tmp_path))
    got = [(s.input.actor, s.input.hlc) for s in log.steps()]
    # smallest head first; the 30/30 tie goes to te-0.db (file name), after which te-0's
    # head is rtc/0 at 20 (its own order), still below te-1's 30
    assert got == [
        ("je/0", 10),
        ("te/1", 15),
        ("je/0", 30),
        ("rtc/0", 20),
        ("te/1", 30),
        ("te/1", 35),
        ("je/0", 40),
    ]
    # each process's own order is kept
    assert [x for x in got if x[0] != "te/1"] == [(s.input.actor, s.input.hlc) for s in te0]
    assert [x for x in got if x[0] == "te/1"] == [(s.input.actor, s.input.hlc) for s in te1]
    assert [(r.run_id, r.process) for r in log.runs()] == [
        ("daemon-1", "te-0"),
        ("daemon-1", "te-1"),
    ]
    assert log.actors() == ["je/0", "rtc/0", "te/1"]
    assert encoded(list(log.steps(actor="te/1"))) == encoded(te1)
    assert encoded(list(log.steps(corr="k"))) == encoded([te1[1]])
    assert [s.actor for s in log.snapshots()] == ["rtc/0"]
    log.close()


def test_equal_hlc_goes_in_file_name_order(tmp_path: Path) -> None:
    _write(tmp_path, "b", [_step("b/1", 1, 5), _step("b/1", 2, 7)])
    _write(tmp_path, "a", [_step("a/1", 1, 5), _step("a/1", 2, 7)])
    got = [s.input.actor for s in open_log(str(tmp_path)).steps()]
    assert got == ["a/1", "b/1", "a/1", "b/1"]


def test_runs_across_files(tmp_path: Path) -> None:
    _write(tmp_path, "p1", [_step("x/1", 1, 1)], run_id="old", at=1.0)
    _write(tmp_path, "p2", [_step("y/1", 1, 2)], run_id="new", at=2.0)
    log = open_log(str(tmp_path))
    assert [s.input.actor for s in log.steps()] == ["y/1"]  # default: begun last
    assert [s.input.actor for s in log.steps("old")] == ["x/1"]
    assert log.actors("old") == ["x/1"]
    with pytest.raises(LogError, match="no run 'gone'"):
        list(log.steps("gone"))
