"""Reading a log changes nothing and never hangs, and each way a replay command can be refused
says what it is (issue 29, §2 and §6): no `-wal`/`-shm` files left beside a log that had none; a
FIFO refused at once; a corrupt SQLite header called corrupt, not "truncated"; `--at -5`; an
`--import` module calling `sys.exit` not read as "diverged"."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, deepserve

from deepserve.cli.main import main
from deepserve.persistence import open_log, open_sink

READS = (("verify",), ("state", "--actor", "dispatch"), ("log",), ("digest",), ("why", "r1"))


class Res:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


Run = Callable[..., Res]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """A replay command run in this process (the process boundary is not what is tested)."""

    def _run(*args: str) -> Res:
        capsys.readouterr()
        code = main(["replay", *args])
        out = capsys.readouterr()
        return Res(code, out.out, out.err)

    return _run


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    """The example simulation's log in pages (`sim`) and in rows (a daemon's writer), each
    closed cleanly: a lone file, no side files."""
    where = tmp_path_factory.mktemp("logs")
    assert deepserve("sim", "example", "--log", "paged.db", cwd=where).returncode == 0
    with open_log(str(where / "paged.db")) as log, open_sink(str(where / "rows.db")) as sink:
        for run in log.runs():
            sink.begin_run(run)
            for step in log.steps(run.run_id):
                sink.append(step)
    return where


@pytest.mark.parametrize("name", ["paged.db", "rows.db"])
def test_reading_leaves_no_side_files(run: Run, logs: Path, tmp_path: Path, name: str) -> None:
    shutil.copy(logs / name, tmp_path / name)
    assert sorted(os.listdir(tmp_path)) == [name]
    for command in READS:
        res = run(command[0], str(tmp_path / name), *command[1:])
        # (the example scenario records no request hops: `why` answers that, and reads all the same)
        assert res.returncode == (2 if command[0] == "why" else 0), (command, res.stderr)
        assert sorted(os.listdir(tmp_path)) == [name], command


def test_a_fifo_is_refused_at_once(run: Run, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.db")  # opening it to read would wait for a writer forever
    for command in (*READS, ("migrate",)):
        res = run(command[0], str(tmp_path / "pipe.db"), *command[1:])
        assert_one_line_error(res, "pipe.db: not a regular file (a FIFO)")


@pytest.mark.parametrize(
    ("offset", "value", "says"),
    [
        (21, 0xFF, "corrupt SQLite header: maximum embedded payload fraction (byte 21) is 255, not 64"),
        (19, 0x07, "corrupt SQLite header: file format read version (byte 19) is 7, not 1 or 2"),
        (47, 0xFF, "corrupt SQLite header: schema format number (byte 44) is 255"),
        (80, 0x01, "corrupt SQLite header: its reserved bytes 72-91 are not zero"),
    ],
)
def test_a_corrupt_header_is_called_corrupt(run: Run, logs: Path, tmp_path: Path, offset: int, value: int,
                                            says: str) -> None:  # fmt: skip
    shutil.copy(logs / "paged.db", tmp_path / "x.db")
    with sqlite3.connect(tmp_path / "x.db") as db:  # the page count is valid only once checkpointed
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(tmp_path / "x.db", "r+b") as f:
        f.seek(offset)
        f.write(bytes([value]))
    line = assert_one_line_error(run("verify", str(tmp_path / "x.db")), says)
    assert "truncated" not in line  # what every header problem was called


def test_a_negative_time_and_a_time_before_an_actor_are_named(run: Run, logs: Path) -> None:
    res = run("state", str(logs / "paged.db"), "--actor", "dispatch", "--at", "-5")
    assert_one_line_error(res, "--at -5: a clock time is never negative")
    res = run("state", str(logs / "paged.db"), "--actor", "worker/4", "--at", "1")
    line = assert_one_line_error(res, "'worker/4' has no record at or before t=1 in run 'sim-0': its first is at t=")
    assert "no actor" not in line  # it was "no actor 'worker/4' ... (actors: ..., worker/4)"


def test_an_import_that_exits_is_not_a_divergence(logs: Path, tmp_path: Path) -> None:
    (tmp_path / "quits.py").write_text("import sys\nsys.exit(1)\n")
    res = deepserve("replay", "verify", str(logs / "paged.db"), "--path", str(tmp_path), "--import", "quits",
                    cwd=tmp_path)  # fmt: skip
    assert_one_line_error(res, "--import quits: importing it exited (sys.exit) with status 1")
