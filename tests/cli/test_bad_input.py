"""Bad input at the edge: one precise line on stderr, exit 2, never a traceback."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
from cliproc import assert_one_line_error, deepserve

from deepserve.core.records import EventRec, InputRec, MemorySink, Step
from deepserve.persistence import open_sink

EXAMPLE_ARGS = ("--requests", "30")


@pytest.fixture(scope="module")
def good_log(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("good")
    res = deepserve("sim", "example", *EXAMPLE_ARGS, "--log", "good.db", cwd=where)
    assert res.returncode == 0, res.stderr
    return where / "good.db"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        ((), ["required", "COMMAND"]),
        (("frobnicate",), ["invalid choice", "frobnicate"]),
        (("sim",), ["required", "SCENARIO"]),
        (("sim", "nope"), ["unknown scenario 'nope'", "example"]),
        (("sim", "example", "--seed", "x"), ["--seed", "'x'"]),
        (("sim", "example", "--requests", "0"), ["--requests", "positive integer"]),
        (("replay",), ["required", "COMMAND"]),
        (("replay", "verify"), ["required", "LOG"]),
        (("replay", "state", "GOOD"), ["required", "--actor"]),
        (("replay", "state", "GOOD", "--actor", "dispatch", "--at", "nan"), ["--at", "finite"]),
        (("replay", "log", "GOOD", "--since", "soon"), ["--since", "'soon'"]),
        (("replay", "log", "GOOD", "--bogus"), ["unrecognized arguments", "--bogus"]),
        (("replay", "verify", "GOOD", "--run", "nope"), ["no run 'nope'"]),
        (("replay", "state", "GOOD", "--actor", "nobody"), ["no actor 'nobody'", "dispatch"]),
        (("replay", "verify", "missing.db"), ["missing.db"]),
    ],
)
def test_bad_arguments(good_log: Path, args, needles) -> None:
    args = tuple(str(good_log) if a == "GOOD" else a for a in args)
    assert_one_line_error(deepserve(*args, cwd=good_log.parent), *needles)


def test_corrupt_empty_directory_and_truncated_logs(good_log: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a log at all\n" * 200)
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.db"
    data = good_log.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    for path in (garbage, empty, tmp_path, truncated):
        for command in ("verify", "digest", "log"):
            line = assert_one_line_error(deepserve("replay", command, str(path), cwd=tmp_path))
            assert str(path) in line, line


def test_wrong_schema_version(good_log: Path, tmp_path: Path) -> None:
    future = tmp_path / "future.db"
    future.write_bytes(good_log.read_bytes())
    with sqlite3.connect(future) as db:
        db.execute("UPDATE schema_version SET version = 999")
    line = assert_one_line_error(deepserve("replay", "verify", str(future), cwd=tmp_path))
    assert "999" in line and "version" in line


def _log_with_unknown_types(path: Path) -> None:
    """A real run of well-behaved actors, with one input and one event of a type
    no module defines (as if written by a newer version of the code)."""
    import divactors

    mem = MemorySink()
    divactors.run(mem, "clock")
    mystery = msgspec.msgpack.encode({"x": 1})
    for i, step in enumerate(mem.steps):
        r = step.input
        if r.actor == "counter" and r.seq == 3:
            inp = InputRec(r.actor, r.seq, r.t, r.hlc, r.kind, r.src, r.msg_id, r.corr, r.reply_to, r.external, "Mystery", mystery)
            mem.steps[i] = Step(inp, [EventRec(r.actor, r.seq, 0, "MysteryEvent", mystery)], [])
    sink = open_sink(str(path), "async")
    sink.begin_run(mem.runs[0])
    for step in mem.steps:
        sink.append(step)
    sink.close()


def test_unknown_message_type(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "replay"))
    log = tmp_path / "mystery.db"
    _log_with_unknown_types(log)

    res = deepserve("replay", "verify", str(log), cwd=tmp_path)
    assert_one_line_error(res, "counter#3", "'Mystery'", "not registered")
    res = deepserve("replay", "state", str(log), "--actor", "counter", cwd=tmp_path)
    assert_one_line_error(res, "counter#3", "'MysteryEvent'", "not registered")

    res = deepserve("replay", "log", str(log), "--actor", "counter", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert 'counter#3  ext/input→counter  Mystery {"x":1}' in res.stdout
    assert 'event   MysteryEvent {"x":1}' in res.stdout
    # Everything else about the run is still readable.
    assert deepserve("replay", "digest", str(log), cwd=tmp_path).returncode == 0
    res = deepserve("replay", "state", str(log), "--actor", "counter", "--at", "1.5", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
