"""A log whose SQLite index is damaged is refused by `check_integrity()` before it can
answer wrongly; `PRAGMA quick_check` alone would let it through."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from store_testdata import expected

from deepserve.persistence import LogError, MemoryLog, MemoryStore, open_log, open_sink

PAGE_OFFSETS = range(64, 4096 - 16, 61)  # where in a page to overwrite 16 bytes


def _demo_log(path: str) -> None:
    run, steps = expected(requests=400)
    with open_sink(path, layout="rows") as sink:
        sink.begin_run(run)
        for s in steps:
            sink.append(s)


def _index_pages(path: str, index: str) -> tuple[int, list[int]]:
    with sqlite3.connect(path) as c:
        size = c.execute("PRAGMA page_size").fetchone()[0]
        pages = [p for (p,) in c.execute("SELECT pageno FROM dbstat WHERE name = ?", (index,))]
    return size, pages


def _check(path: str, pragma: str) -> bool:
    with sqlite3.connect(path) as c:
        return c.execute(f"PRAGMA {pragma}").fetchall() == [("ok",)]


def _damage_quick_check_misses(good: str, bad: str) -> tuple[int, int]:
    """Overwrite 16 bytes of an `ix_inputs_actor` page where quick_check still says ok
    but the index no longer matches its table; returns (page, offset)."""
    size, pages = _index_pages(good, "ix_inputs_actor")
    for page in pages:
        for off in PAGE_OFFSETS:
            shutil.copy(good, bad)
            with open(bad, "r+b") as f:
                f.seek((page - 1) * size + off)
                f.write(b"\xa5" * 16)
            if _check(bad, "quick_check") and not _check(bad, "integrity_check"):
                return page, off
    raise AssertionError("no 16-byte overwrite that quick_check misses")


def test_damaged_index_is_refused_in_one_line(tmp_path: Path) -> None:
    good, bad = str(tmp_path / "good.db"), str(tmp_path / "bad.db")
    _demo_log(good)
    _damage_quick_check_misses(good, bad)
    with open_log(bad) as log:  # opening reads only the schema: it does not notice
        with pytest.raises(LogError) as info:
            log.check_integrity()
    msg = str(info.value)
    assert msg.startswith(f"{bad}: damaged SQLite file, refusing to read it: ")
    assert "(PRAGMA integrity_check)" in msg and "\n" not in msg
    with open_log(good) as log:
        log.check_integrity()  # intact: no error


def test_a_damaged_file_in_a_run_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    good = str(tmp_path / "good.db")
    _demo_log(good)
    shutil.copy(good, tmp_path / "run" / "a.db")
    _damage_quick_check_misses(good, str(tmp_path / "run" / "b.db"))
    with open_log(str(tmp_path / "run")) as log, pytest.raises(LogError, match="b.db: damaged"):
        log.check_integrity()


def test_memory_logs_have_nothing_to_check() -> None:
    MemoryLog(MemoryStore()).check_integrity()


@pytest.mark.parametrize("command", ["verify", "log", "migrate"])
def test_a_schema_damaged_into_bytes_that_are_not_utf8_is_refused_in_one_line(
    tmp_path: Path, command: str
) -> None:
    """sqlite3 decodes what SQLite reports as UTF-8: a damaged schema's bytes in an error made
    every replay command fail with 'internal error: UnicodeDecodeError', exit 3 (a user tour)."""
    import subprocess
    import sys

    path = tmp_path / "bad.db"
    _demo_log(str(path))
    data = bytearray(path.read_bytes())
    # The schema's row for table `inputs` ("table", name, table name, root page, SQL): a byte
    # of its name that is not UTF-8 (a continuation byte with no start), quoted by SQLite's error
    at = data.index(b"tableinputsinputs") + len("tablein")
    data[at] = 0x87
    path.write_bytes(bytes(data))
    cli = subprocess.run([sys.executable, "-m", "deepserve", "replay", command, str(path)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cli.returncode == 2, cli.stderr
    assert cli.stderr.count("\n") == 1 and "internal error" not in cli.stderr
    assert f"{path}: " in cli.stderr and "SQLite file" in cli.stderr
