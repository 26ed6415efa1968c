"""Row checksums (schema v5, persistence/rows.py): a row-layout log answers from a damaged
row with a `LogError` naming it, never with another record. Before v5 one flipped byte in
a payload replayed as another message with exit 0 (the layout of the daemon's logs and of
an embedded `open_sink`)."""

from __future__ import annotations

import random
import shutil
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from store_testdata import encoded, force_reader_process, run_rec

from deepserve.core.records import EventRec, InputRec, OutputRec, SnapshotRec, Step
from deepserve.persistence import LogError, open_log, open_sink
from deepserve.persistence.rows import (
    INPUT_BOOLS,
    INPUT_FLOATS,
    OUTPUT_BOOLS,
    OUTPUT_FLOATS,
    RUN_FLOATS,
)

DELIVERED = 0


def _steps(n: int = 60) -> list[Step]:
    """Steps with every kind of row; REAL fields given as an int and as -0.0."""
    out = []
    for i in range(n):
        inp = InputRec("a/1", i, -0.0 if i == 0 else i / 4, i, DELIVERED, "b/2", i, f"c{i % 3}",
                       None, i % 2 == 0, "Ping", bytes([i % 256]) * 40, ask=i % 3 == 0)  # fmt: skip
        evs = (EventRec("a/1", i, 0, "Evt", b"event-%d" % i),)
        outs = (OutputRec("a/1", i, 0, 1, "a/1", 100 + i, 5 if i % 2 else -0.0, "tick", None, None,
                          i % 2 == 1, "Tick", b"tick-%d" % i),)  # fmt: skip
        snap = SnapshotRec("a/1", i, "mod:State", b"state-%d" % i) if i % 10 == 9 else None
        out.append(Step(inp, evs, outs, snap))
    return out


def _write(target: str, steps: list[Step]) -> None:
    with open_sink(target, layout="rows") as sink:  # the row layout
        sink.begin_run(run_rec("rows"))
        for s in steps:
            sink.append(s)


def _as_stored(steps: list[Step]) -> list[Step]:
    """What a database gives back: REAL fields as floats, -0.0 as 0.0."""
    def fix(rec: Any) -> Any:
        if isinstance(rec, InputRec):
            return msgspec.structs.replace(rec, t=float(rec.t) + 0.0)
        return msgspec.structs.replace(rec, delay=float(rec.delay) + 0.0)

    return [Step(fix(s.input), s.events, tuple(fix(o) for o in s.outputs), s.snapshot) for s in steps]


def _read_all(target: str) -> tuple[list, list, bytes]:
    with open_log(target) as log:
        log.check_integrity()
        return log.runs(), list(log.snapshots()), encoded(list(log.steps()))


def test_field_positions_match_the_records() -> None:
    # rows.py cannot import core (the child processes start without it): its positions
    # are checked here
    assert [InputRec.__struct_fields__[i] for i in INPUT_FLOATS + INPUT_BOOLS] == ["t", "external", "ask"]
    assert [OutputRec.__struct_fields__[i] for i in OUTPUT_FLOATS + OUTPUT_BOOLS] == ["delay", "ask"]
    from deepserve.core.records import RunRec

    assert [RunRec.__struct_fields__[i] for i in RUN_FLOATS] == ["started_at"]


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Callable[[str], None]]:
    """(log target, run SQL on it)."""
    if request.param == "sqlite":
        path = str(tmp_path / "run.db")

        def sql(text: str) -> None:
            with sqlite3.connect(path) as c:
                c.execute(text)

        return path, sql
    url = request.getfixturevalue("postgres_url")
    server = request.getfixturevalue("postgres_server")
    return url, lambda text: server.execute(text, database=url.rsplit("/", 1)[1])


def test_rows_read_back_as_stored_and_pass_their_checksums(target: tuple[str, Any]) -> None:
    url, _ = target
    steps = _steps()
    _write(url, steps)
    with open_log(url) as log:
        assert encoded(list(log.steps())) == encoded(_as_stored(steps))
        assert [s.payload for s in log.snapshots()] == [s.snapshot.payload for s in steps if s.snapshot]
        assert log.runs() == [run_rec("rows")]


DAMAGE = {  # what is done to the log -> the row that the reader names
    "an input's value": ("UPDATE inputs SET payload = 'x' WHERE id = 7", "inputs", 7),
    "an event's value": ("UPDATE events SET type = 'Evu' WHERE step_id = 12", "events", 12),
    "an output's value": ("UPDATE outputs SET delay = 6.0 WHERE step_id = 20", "outputs", 20),
    "a snapshot's value": ("UPDATE snapshots SET seq = 31 WHERE step_id = 30", "snapshots", 30),
    # a row that moved to another step: its own sum holds its step's id (a user tour moved a
    # JobFinished event, and `why` answered that the request ended elsewhere, exit 0)
    "an event moved": ("UPDATE events SET step_id = 11 WHERE step_id = 12", "events", 11),
    "an output moved": ("UPDATE outputs SET step_id = 21 WHERE step_id = 20", "outputs", 21),
    # rows deleted or added: the input's sum holds how many its step has
    "an event deleted": ("DELETE FROM events WHERE step_id = 12", "inputs", 12),
    "a snapshot deleted": ("DELETE FROM snapshots WHERE step_id = 30", "inputs", 30),
    "an output added": ("INSERT INTO outputs (step_id, run_id, actor, seq, idx, kind, dst, msg_id, delay, "
                        "key, corr, reply_to, ask, type, payload, crc32) SELECT 5, run_id, actor, seq, idx, "
                        "kind, dst, msg_id, delay, key, corr, reply_to, ask, type, payload, crc32 FROM "
                        "outputs WHERE step_id = 4", "outputs", 5),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damage_is_refused_naming_its_row(damage: str, target: tuple[str, Any]) -> None:
    url, sql = target
    _write(url, _steps())
    change, table, step = DAMAGE[damage]
    sql(change)
    want = f"{url}: damaged log: the {table} row of step {step} does not match its checksum"
    with open_log(url) as log, pytest.raises(LogError) as info:
        list(log.steps())
    assert str(info.value).startswith(want)
    if damage == "a snapshot's value":
        with open_log(url) as log, pytest.raises(LogError, match="the snapshots row of step 30"):
            list(log.snapshots())


def test_a_copied_output_row_in_its_own_step_is_refused(tmp_path: Path) -> None:
    """A second copy of a row in the same step: its own sum is right, its step's count is not."""
    path = str(tmp_path / "run.db")
    _write(path, _steps())
    with sqlite3.connect(path) as c:
        cols = [r[1] for r in c.execute("PRAGMA table_info(outputs)") if r[1] != "id"]
        c.execute(f"INSERT INTO outputs ({', '.join(cols)}) SELECT {', '.join(cols)} FROM outputs "
                  "WHERE step_id = 4")  # fmt: skip
    with open_log(path) as log, pytest.raises(LogError, match="the inputs row of step 4 does not match"):
        list(log.steps())


def test_a_changed_run_record_is_refused(target: tuple[str, Any]) -> None:
    url, sql = target
    _write(url, _steps(3))
    sql("UPDATE runs SET config = '{\"seed\": 8}'")
    with open_log(url) as log, pytest.raises(LogError, match="the runs row of run 'rows' does not match"):
        log.runs()


def test_the_reader_process_refuses_a_damaged_row_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "run.db")
    _write(path, _steps(300))
    with sqlite3.connect(path) as c:
        c.execute("UPDATE events SET payload = 'x' WHERE step_id = 250")
    force_reader_process(monkeypatch)  # steps past the first two come from the child
    with open_log(path) as log, pytest.raises(LogError) as info:
        list(log.steps())
    assert str(info.value).startswith(f"{path}: damaged log: the events row of step 250 does not")


def test_random_overwrites_are_refused_or_harmless(tmp_path: Path) -> None:
    """16 random bytes over the file, 40 times (the user tour's test, on which 10 of 14
    went unseen before v5): every read refuses the file or answers exactly as before."""
    path = str(tmp_path / "run.db")
    _write(path, _steps(200))
    want = _read_all(path)
    size = Path(path).stat().st_size
    rng = random.Random(7)
    refused = 0
    for i in range(40):
        copy = str(tmp_path / f"hit{i}.db")
        shutil.copyfile(path, copy)
        with open(copy, "r+b") as f:
            f.seek(rng.randrange(4096, size - 16))  # past page 1 (the header: checked apart)
            f.write(rng.randbytes(16))
        try:
            got = _read_all(copy)
        except LogError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(copy), exc
            refused += 1
            continue
        assert got == want, f"overwrite {i} changed what the log answers"
    assert refused >= 10  # measured: 17 of the 40 land in rows or structures, the rest in free space


def test_replay_refuses_a_damaged_row_with_one_line(tmp_path: Path) -> None:
    import subprocess

    from store_testdata import sim_run

    path = str(tmp_path / "run.db")
    with open_sink(path, layout="rows") as sink:
        sim_run(sink, seed=5)
    with sqlite3.connect(path) as c:
        c.execute("UPDATE outputs SET payload = substr(payload, 2) WHERE id = 3")  # still a blob
        (step,) = c.execute("SELECT step_id FROM outputs WHERE id = 3").fetchone()
    for cmd in (["verify"], ["log"], ["digest"]):
        res = subprocess.run([sys.executable, "-m", "deepserve", "replay", *cmd, path],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert res.returncode == 2, (cmd, res.stdout, res.stderr)
        assert res.stderr == (f"deepserve: error: {path}: damaged log: the outputs row of step {step} "
                              "does not match its checksum (its record cannot be trusted)\n")  # fmt: skip


def test_reading_a_copy_of_a_live_log_leaves_it_as_it_was(tmp_path: Path) -> None:
    """A reader opens the file read-only: a read-write connection, the last to close,
    checkpointed the WAL into the file and deleted it, so inspecting a copy of a live or
    killed daemon's log changed the evidence (a user tour: md5 changed, -wal gone)."""
    import hashlib
    import subprocess

    live = str(tmp_path / "live.db")
    with open_sink(live, layout="rows") as sink:  # kept open: its last commits are in the WAL
        sink.begin_run(run_rec("rows"))
        for s in _steps(50):
            sink.append(s)
        sink.flush()
        copy = tmp_path / "copy"
        copy.mkdir()
        for suffix in ("", "-wal", "-shm"):
            if Path(live + suffix).exists():
                shutil.copyfile(live + suffix, str(copy / "live.db") + suffix)
    path = str(copy / "live.db")
    assert Path(path + "-wal").stat().st_size > 0

    def digests() -> list[str]:
        return [hashlib.sha256(Path(path + s).read_bytes()).hexdigest() for s in ("", "-wal")]

    before = digests()
    with open_log(path) as log:
        log.check_integrity()
        assert len(list(log.steps())) == 50  # the WAL's frames are read
    res = subprocess.run([sys.executable, "-m", "deepserve", "replay", "log", path, "--actor", "a/1"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert digests() == before
