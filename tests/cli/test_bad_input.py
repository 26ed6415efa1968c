"""Bad input at the edge: one precise line on stderr, exit 2, never a traceback.

The command runs in this process (`in_process`: what it checks is the message and the exit
status), except where the process boundary is the point: a sink whose close fails at exit."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from cliproc import assert_one_line_error, in_process

from deepserve.core.records import EventRec, InputRec, MemorySink, Step
from deepserve.persistence import open_sink

EXAMPLE_ARGS = ("--requests", "30")


@pytest.fixture(scope="module")
def good_log(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("good")
    res = in_process("sim", "example", *EXAMPLE_ARGS, "--log", "good.db", cwd=where)
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
        # A filter naming something the run does not hold lists what exists.
        (("replay", "log", "GOOD", "--actor", "nobody"), ["no actor 'nobody'", "dispatch", "worker/0"]),
        (("replay", "log", "GOOD", "--corr", "nope"), ["no input with corr 'nope'", "job-0"]),
        (("replay", "log", "GOOD", "--since", "50", "--until", "10"), ["empty time range", "--since 50"]),
        (("replay", "migrate", "GOOD", "--run", "X"), ["unrecognized arguments", "--run"]),
        (("sim", "example", "--seed", str(2**63)), ["--seed", "2**63-1", str(2**63)]),
        (("sim", "example", "--seed", str(-(2**63) - 1)), ["--seed", "-2**63"]),
        (("bench", "kernel", "--scale", "1e-5"), ["--scale", "between 0.001 and 100", "1e-5"]),
        (("bench", "kernel", "--pg", "notaurl"), ["--pg notaurl", "not a PostgreSQL URL"]),
        (("bench", "kernel", "--pg", "postgresql://u@127.0.0.1:1/db"), ["--pg", "cannot connect"]),
    ],
)
def test_bad_arguments(good_log: Path, args, needles) -> None:
    args = tuple(str(good_log) if a == "GOOD" else a for a in args)
    assert_one_line_error(in_process(*args, cwd=good_log.parent), *needles)


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
            line = assert_one_line_error(in_process("replay", command, str(path), cwd=tmp_path))
            assert str(path) in line, line


def test_wrong_schema_version(good_log: Path, tmp_path: Path) -> None:
    future = tmp_path / "future.db"
    future.write_bytes(good_log.read_bytes())
    with sqlite3.connect(future) as db:
        db.execute("UPDATE schema_version SET version = 999")
    line = assert_one_line_error(in_process("replay", "verify", str(future), cwd=tmp_path))
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

    res = in_process("replay", "verify", str(log), cwd=tmp_path)
    assert_one_line_error(res, "counter#3", "'Mystery'", "not registered")
    res = in_process("replay", "state", str(log), "--actor", "counter", cwd=tmp_path)
    assert_one_line_error(res, "counter#3", "'MysteryEvent'", "not registered")

    res = in_process("replay", "log", str(log), "--actor", "counter", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert 'counter#3  ext/input→counter  Mystery {"x":1}' in res.stdout
    assert 'event   MysteryEvent {"x":1}' in res.stdout
    # Everything else about the run is still readable.
    assert in_process("replay", "digest", str(log), cwd=tmp_path).returncode == 0
    res = in_process("replay", "state", str(log), "--actor", "counter", "--at", "1.5", cwd=tmp_path)
    assert res.returncode == 0, res.stderr


def test_filters_that_match_something_still_list(good_log: Path) -> None:
    res = in_process("replay", "log", str(good_log), "--actor", "worker/0", "--corr", "job-0", cwd=good_log.parent)
    assert res.returncode == 0 and "worker/0#2" in res.stdout, res.stderr
    assert res.stderr == ""


def test_filters_that_each_hold_but_select_nothing_say_so(good_log: Path) -> None:
    """Both names exist; no input has both: an empty listing, and one line saying why."""
    for extra in ((), ("--json",)):
        res = in_process("replay", "log", str(good_log), "--actor", "dispatch", "--corr", "job-0",
                        "--since", "1e9", *extra, cwd=good_log.parent)
        assert res.returncode == 0 and res.stdout == "", res.stderr
        assert res.stderr == "no inputs match (actor 'dispatch', corr 'job-0', since 1e+09)\n"


def test_a_refused_seed_writes_nothing(tmp_path: Path) -> None:
    assert_one_line_error(in_process("sim", "example", "--seed", str(2**64), cwd=tmp_path), "--seed")
    assert list(tmp_path.iterdir()) == []


def test_log_in_a_missing_directory_is_refused_not_created(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "x.db"
    res = in_process("sim", "example", "--log", str(target), cwd=tmp_path)
    assert_one_line_error(res, f"no such directory {target.parent}")
    assert not (tmp_path / "no").exists()


def test_default_log_directory_is_still_created(tmp_path: Path) -> None:
    res = in_process("sim", "example", *EXAMPLE_ARGS, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "runs" / "example-0.db").is_file()


def test_bench_checks_the_pg_url_before_measuring(tmp_path: Path) -> None:
    """Before: every other suite ran first (minutes), then the URL failed."""
    res = in_process("bench", "kernel", "--pg", "postgresql://u@127.0.0.1:1/db", cwd=tmp_path)
    assert_one_line_error(res, "cannot connect")
    assert "measuring" not in res.stderr


@pytest.mark.parametrize("command", [("replay", "verify"), ("replay", "log"), ("replay", "migrate")])
def test_postgres_without_asyncpg_names_the_extra(tmp_path: Path, monkeypatch, command) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)  # as if the extra were not installed
    res = in_process(*command, "postgresql://u@127.0.0.1:1/db", cwd=tmp_path)
    assert_one_line_error(res, "asyncpg", "pip install 'deepserve[postgres]'")


def test_sim_to_postgres_without_asyncpg_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    res = in_process("sim", "example", "--log", "postgresql://u:pw@127.0.0.1:1/db", cwd=tmp_path)
    line = assert_one_line_error(res, "deepserve[postgres]")
    assert "pw" not in line  # the password stays out of the message


def _run_dir(tmp_path: Path, seeds: tuple[int, ...]) -> Path:
    run_dir = tmp_path / "runs"
    run_dir.mkdir()
    for seed in seeds:
        res = in_process("sim", "example", *EXAMPLE_ARGS, "--seed", str(seed), "--log", f"runs/s{seed}.db", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    return run_dir


def test_verify_of_a_directory_names_the_run_and_refuses_to_guess(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, (4, 5))
    for command in ("verify", "digest", "log"):
        line = assert_one_line_error(in_process("replay", command, str(run_dir), cwd=tmp_path))
        assert "2 runs" in line and "sim-4" in line and "sim-5" in line and "--run" in line, line
    res = in_process("replay", "verify", str(run_dir), "--run", "sim-5", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("identical") and "(run 'sim-5')" in res.stdout


def test_verify_of_a_one_run_directory_names_it(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, (6,))
    res = in_process("replay", "verify", str(run_dir), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "(run 'sim-6')" in res.stdout


def test_a_log_whose_last_writes_fail_at_exit_sets_the_exit_status(tmp_path: Path) -> None:
    """A sink left open whose close fails: before, the command exited 0 and only an
    at-exit report said the log had lost its last writes."""
    code = (
        "from deepserve.core.records import InputRec, RunRec, Step\n"
        "from deepserve.persistence import open_sink\n"
        "from deepserve.cli import main\n"
        "sink = open_sink('left.db')\n"
        "sink.begin_run(RunRec('r', 'sim', 1, '{}', 'v', 'h', 0.0))\n"
        "bad = InputRec('a/1', 0, 0.0, 1, 0, 'ext/x', 1, None, None, True, 'M', object())\n"
        "sink.append(Step(bad, (), ()))  # a value SQLite does not take: the last write fails\n"
        "raise SystemExit(main(['sim', 'example', '--requests', '5', '--log', 'ok.db']))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "log: ok.db" in res.stdout  # the command itself did its work
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "log sink failed at close" in lines[0] and "left.db" in lines[0], res.stderr
