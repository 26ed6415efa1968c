"""A log whose SQLite file is damaged is refused by every replay command.

Overwriting 16 bytes of an index page leaves a file SQLite still opens and queries:
without a check, `replay state` folds from the wrong inputs and `replay log` drops
steps, all with exit 0. An incident log is evidence: a wrong answer is worse than none.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, in_process

from deepserve.persistence import open_log, open_sink

COMMANDS = (
    ("verify",),
    ("state", "--actor", "dispatch"),
    ("log",),
    ("log", "--actor", "dispatch"),
    ("digest",),
    ("migrate",),
)


@pytest.fixture(scope="module")
def paged_log(tmp_path_factory) -> Path:
    """The example simulation's log, as `deepserve sim` writes it: in pages."""
    where = tmp_path_factory.mktemp("demo")
    res = in_process("sim", "example", "--log", "paged.db", cwd=where)
    assert res.returncode == 0, res.stderr
    return _checkpointed(where / "paged.db")


@pytest.fixture(scope="module")
def demo_log(paged_log: Path) -> Path:
    """The same steps in rows, as the thread writer keeps them with layout="rows" (indexed per record)."""
    rows = paged_log.parent / "demo.db"
    with open_log(str(paged_log)) as log, open_sink(str(rows), layout="rows") as sink:
        for run in log.runs():
            sink.begin_run(run)
            for step in log.steps(run.run_id):
                sink.append(step)
    return _checkpointed(rows)


def _checkpointed(path: Path) -> Path:
    with sqlite3.connect(path) as db:  # every page in the main file
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def _leaf_pages(path: Path, index: str) -> list[int]:
    """Page numbers of an index's b-tree leaves, found by walking it from its root
    (file format: sqlite.org/fileformat2.html, b-tree pages)."""
    with sqlite3.connect(path) as db:
        ((root,),) = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,))
    data = path.read_bytes()
    page_bytes = int.from_bytes(data[16:18], "big")
    leaves, todo = [], [root]
    while todo:
        page = todo.pop()
        base = (page - 1) * page_bytes
        head = base + (100 if page == 1 else 0)
        if data[head] == 0x0A:  # index leaf
            leaves.append(page)
            continue
        if data[head] != 0x02:  # index interior
            raise AssertionError(f"page {page} of {index} is not an index page")
        cells = int.from_bytes(data[head + 3 : head + 5], "big")
        todo.append(int.from_bytes(data[head + 8 : head + 12], "big"))  # right-most child
        for i in range(cells):
            ptr = int.from_bytes(data[head + 12 + 2 * i : head + 14 + 2 * i], "big")
            todo.append(int.from_bytes(data[base + ptr : base + ptr + 4], "big"))
    return sorted(leaves)


def _damage(good: Path, out: Path, index: str) -> None:
    """Overwrite 16 bytes of the keys of an index, in the middle of its second leaf."""
    shutil.copy(good, out)
    data = good.read_bytes()
    page_bytes = int.from_bytes(data[16:18], "big")
    base = (_leaf_pages(good, index)[1] - 1) * page_bytes
    cells = int.from_bytes(data[base + 3 : base + 5], "big")
    middle = base + 8 + 2 * (cells // 2)  # a leaf's cell pointers follow its 8-byte header
    cell = base + int.from_bytes(data[middle : middle + 2], "big")
    with open(out, "r+b") as f:
        f.seek(cell + 4)  # past the cell's size and record header: into the key values
        f.write(b"\x5a" * 16)


def _integrity(path: Path) -> str:
    with sqlite3.connect(path) as db:
        try:
            return " ".join(str(r[0]) for r in db.execute("PRAGMA integrity_check"))
        except sqlite3.DatabaseError as exc:
            return str(exc)


@pytest.mark.parametrize("index", ["ix_inputs_actor", "ix_events_step"])
def test_every_replay_command_refuses_a_damaged_index(demo_log: Path, tmp_path: Path, index) -> None:
    bad = tmp_path / "bad.db"
    _damage(demo_log, bad, index)
    assert _integrity(bad) != "ok"  # the damage is real, and SQLite can tell
    before = bad.read_bytes()
    for command, *rest in COMMANDS:
        res = in_process("replay", command, str(bad), *rest, cwd=tmp_path)
        line = assert_one_line_error(res, str(bad), "damaged SQLite file", "integrity_check")
        assert "page" in line or "index" in line or "malformed" in line, line
        assert res.stdout == "", (command, res.stdout[:200])
    assert bad.read_bytes() == before  # migrate refused: the evidence is untouched


def test_every_replay_command_refuses_a_damaged_page(paged_log: Path, tmp_path: Path) -> None:
    """16 bytes inside a page's steps: SQLite's check passes (it does not look into a
    blob), the page's checksum does not."""
    bad = tmp_path / "bad.db"
    with sqlite3.connect(paged_log) as db:
        page_id, body = db.execute("SELECT id, body FROM pages ORDER BY id LIMIT 1 OFFSET (SELECT count(*) / 2 FROM pages)").fetchone()
    data = paged_log.read_bytes()
    at = data.index(body[len(body) // 2 : len(body) // 2 + 64])  # within one overflow page
    bad.write_bytes(data[:at] + b"\x5a" * 16 + data[at + 16 :])
    assert _integrity(bad) == "ok"
    for command, *rest in COMMANDS:
        res = in_process("replay", command, str(bad), *rest, cwd=tmp_path)
        # migrate too: it said "already schema 4", exit 0, of a damaged file (a user tour)
        line = assert_one_line_error(res, str(bad), f"damaged log: page {page_id} of run")
        assert line.endswith("fails its checksum (its steps cannot be trusted)"), line
        assert res.stdout == "", (command, res.stdout[:200])


@pytest.mark.parametrize("layout", ["rows", "pages"])
def test_a_whole_log_passes_the_check(demo_log: Path, paged_log: Path, tmp_path: Path, layout) -> None:
    log = demo_log if layout == "rows" else paged_log
    res = in_process("replay", "verify", str(log), cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("identical"), res.stderr


def test_a_damaged_file_in_a_run_directory_is_named(demo_log: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(demo_log, run_dir / "a.db")
    _damage(demo_log, run_dir / "b.db", "ix_inputs_actor")
    res = in_process("replay", "log", str(run_dir), cwd=tmp_path)
    assert_one_line_error(res, str(run_dir / "b.db"), "damaged SQLite file")


@pytest.mark.parametrize("layout", ["rows", "pages"])
def test_every_replay_command_refuses_a_log_missing_a_step(demo_log: Path, tmp_path: Path, layout) -> None:
    """A deleted step (an input row with its children, or a whole page) leaves every checksum
    intact; the gap in the step ids gives it away (a tour: `replay why` left a hop out, exit 0)."""
    bad = tmp_path / "bad.db"
    if layout == "rows":
        shutil.copy(demo_log, bad)
    else:  # 4 pages: the second one goes
        assert in_process("sim", "example", "--requests", "800", "--log", str(bad), cwd=tmp_path).returncode == 0
        _checkpointed(bad)
    with sqlite3.connect(bad) as db:
        if layout == "rows":
            (step,) = db.execute("SELECT id FROM inputs ORDER BY id LIMIT 1 OFFSET 40").fetchone()
            for table in ("events", "outputs", "snapshots"):
                db.execute(f"DELETE FROM {table} WHERE step_id = ?", (step,))
            db.execute("DELETE FROM inputs WHERE id = ?", (step,))
        else:
            db.execute("DELETE FROM pages WHERE id = (SELECT id FROM pages ORDER BY id LIMIT 1 OFFSET 1)")
    assert _integrity(bad) == "ok"
    for command, *rest in COMMANDS:
        res = in_process("replay", command, str(bad), *rest, cwd=tmp_path)
        line = assert_one_line_error(res, str(bad), "damaged log: it holds ")
        assert "are missing or repeated (a deleted row or page" in line, line
        assert res.stdout == "", (command, res.stdout[:200])
