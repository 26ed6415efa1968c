"""A new SQLite log is its user's alone (issue 29 §1: logs 0600): a simulation's `--log`, a log
`open_sink` makes, and their -wal/-shm files, whatever the umask; an empty file the user made
first keeps the mode the user gave it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from deepserve.cli.main import main
from deepserve.persistence import open_sink


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0o022)  # the usual umask: SQLite alone made logs 0644
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
def test_a_simulations_log_is_0600(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "sim.db"
    assert main(["sim", "example", "--log", str(log)]) == 0, capsys.readouterr().err
    files = [p for p in tmp_path.iterdir() if p.name.startswith("sim.db")]
    assert files and {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}


@pytest.mark.usefixtures("open_umask")
def test_a_log_open_sink_makes_is_0600_with_its_wal(tmp_path: Path) -> None:
    log = tmp_path / "rows.db"
    sink = open_sink(str(log), "async")
    try:
        wal = Path(f"{log}-wal")
        assert mode(log) == 0o600
        if wal.exists():  # open: SQLite gives the WAL the log's mode
            assert mode(wal) == 0o600
    finally:
        sink.close()
    assert mode(log) == 0o600
    mine = tmp_path / "touched.db"  # `touch run.db` first: the user chose its mode
    mine.touch(mode=0o640)
    os.chmod(mine, 0o640)
    open_sink(str(mine), "async").close()
    assert mode(mine) == 0o640
