"""The store contract, run against every backend: in-memory, SQLite, PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from store_testdata import (
    edge_steps,
    encoded,
    expected,
    force_reader_process,
    run_rec,
    sim_run,
)

from deepserve.core.records import RunRec, Step
from deepserve.persistence import LogError, MemoryLog, MemoryStore, open_log, open_sink
from deepserve.persistence.pages import ZSTD_MAGIC, checked_body
from deepserve.persistence.sql_reader import CHUNK

ROW_KINDS = ("sqlite-rows", "sqlite-readproc")  # the thread writer's row layout (a reader process reads rows)


class Backend:
    """Opens sinks and readers on one store (one file, one database, one MemoryStore)."""

    def __init__(self, kind: str, target: str | None) -> None:
        self.kind = kind
        self.target = target
        self.memory = MemoryStore()
        self._open: list[Any] = []

    def sink(self, durability: str = "async") -> Any:
        if self.kind == "memory":
            return self.memory
        # the writer process is async-only: outbox stays on the thread writer
        writer = "process" if self.kind == "sqlite-process" and durability == "async" else "thread"
        layout = "rows" if self.kind in ROW_KINDS else "pages"
        sink = open_sink(self.target, durability, writer=writer, layout=layout)  # type: ignore[arg-type]
        self._open.append(sink)
        return sink

    def log(self) -> Any:
        if self.kind == "memory":
            return MemoryLog(self.memory)
        log = open_log(self.target)  # type: ignore[arg-type]
        self._open.append(log)
        return log

    def write(self, run: RunRec, steps: list[Step], durability: str = "async") -> None:
        sink = self.sink(durability)
        sink.begin_run(run)
        for step in steps:
            sink.append(step)
        sink.close()

    def close(self) -> None:
        for thing in self._open:
            thing.close()


@pytest.fixture(params=["memory", "sqlite", "sqlite-rows", "sqlite-process", "sqlite-readproc", "postgresql"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    """`sqlite`: the thread writer's pages (the default layout); `sqlite-rows`: its rows;
    `sqlite-process`: written by the writer process; `sqlite-readproc`: rows read (past
    its first two steps) by a reader process."""
    target = None
    if request.param.startswith("sqlite"):
        target = str(tmp_path / "run.db")
    elif request.param == "postgresql":
        target = request.getfixturevalue("postgres_url")
    if request.param == "sqlite-readproc":
        force_reader_process(monkeypatch)
    b = Backend(request.param, target)
    yield b
    b.close()


def test_sim_run_reads_back_byte_identical(backend: Backend) -> None:
    sink = backend.sink()
    sim_run(sink, seed=5)
    sink.close()
    run, steps = expected(seed=5)
    log = backend.log()
    [got_run] = log.runs()
    assert msgspec.structs.replace(got_run, started_at=0.0) == msgspec.structs.replace(
        run, started_at=0.0
    )
    assert encoded(list(log.steps())) == encoded(steps)
    assert encoded(list(log.steps(run.run_id))) == encoded(steps)


def test_edge_records_read_back_byte_identical(backend: Backend) -> None:
    steps = edge_steps()
    backend.write(run_rec("edge"), steps)
    log = backend.log()
    assert log.runs() == [run_rec("edge")]
    assert encoded(list(log.steps())) == encoded(steps)
    assert log.actors() == ["a/1", "数/字"]  # dead letters (seq -1) name no live actor


def _select(steps: list[Step], actor=None, corr=None, since=None, until=None) -> list[Step]:  # type: ignore[no-untyped-def]
    return [
        s
        for s in steps
        if (actor is None or s.input.actor == actor)
        and (corr is None or s.input.corr == corr)
        and (since is None or s.input.t >= since)
        and (until is None or s.input.t <= until)
    ]


@pytest.mark.parametrize(
    "filters",
    [
        {"actor": "counter/0"},
        {"actor": "log/0"},
        {"actor": "nobody/9"},
        {"actor": "missing/1"},
        {"corr": "req-3"},
        {"corr": "req-dead"},
        {"since": 1.0, "until": 2.0},
        {"since": 4.75},
        {"until": 0.25},
        {"actor": "counter/1", "since": 1.5, "until": 4.5},
        {"actor": "log/0", "corr": "req-6"},
    ],
)
def test_filters(backend: Backend, filters: dict[str, Any]) -> None:
    run, steps = expected()
    backend.write(run, steps)
    want = _select(steps, **filters)
    assert encoded(list(backend.log().steps(**filters))) == encoded(want)


def test_several_runs_in_one_store(backend: Backend) -> None:
    run_a, steps_a = expected(seed=1, run_id="run-a")
    run_b, steps_b = expected(seed=2, run_id="run-b", requests=5)
    backend.write(run_a, steps_a)
    backend.write(run_b, steps_b, durability="outbox")
    log = backend.log()
    assert [r.run_id for r in log.runs()] == ["run-a", "run-b"]
    assert encoded(list(log.steps("run-a"))) == encoded(steps_a)
    assert encoded(list(log.steps("run-b"))) == encoded(steps_b)
    assert encoded(list(log.steps())) == encoded(steps_b)  # default: the last run begun
    assert encoded(list(log.steps("run-a", corr="req-7"))) == encoded(
        _select(steps_a, corr="req-7")
    )
    assert list(log.steps("run-b", corr="req-7")) == []
    assert log.actors("run-a") == ["counter/0", "counter/1", "log/0"]
    with pytest.raises(LogError, match="no run 'nope'"):
        list(log.steps("nope"))
    with pytest.raises(LogError, match="no run 'nope'"):
        log.actors("nope")


def test_two_runs_through_one_sink(backend: Backend) -> None:
    steps = edge_steps()
    sink = backend.sink()
    sink.begin_run(run_rec("first"))
    for s in steps[:2]:
        sink.append(s)
    sink.begin_run(run_rec("second", process="te-1"))
    for s in steps[2:]:
        sink.append(s)
    sink.close()
    log = backend.log()
    assert log.runs() == [run_rec("first"), run_rec("second", process="te-1")]
    assert encoded(list(log.steps("first"))) == encoded(steps[:2])
    assert encoded(list(log.steps("second"))) == encoded(steps[2:])


def test_snapshots(backend: Backend) -> None:
    run, steps = expected()
    backend.write(run, steps)
    log = backend.log()
    want = [s.snapshot for s in steps if s.snapshot is not None]
    assert len(want) >= 3
    assert encoded(list(log.snapshots())) == encoded(want)
    mine = [s for s in want if s.actor == "counter/1"]
    assert mine and encoded(list(log.snapshots(actor="counter/1"))) == encoded(mine)
    # log/0 records nothing periodic: only its final state, logged at run end
    assert [s.actor for s in log.snapshots(actor="log/0")] == ["log/0"]


def test_empty_log(backend: Backend) -> None:
    backend.sink().close()
    log = backend.log()
    assert log.runs() == []
    assert log.actors() == []
    assert list(log.steps()) == []
    assert list(log.snapshots()) == []
    with pytest.raises(LogError):
        list(log.steps("any"))


def test_run_without_steps(backend: Backend) -> None:
    backend.write(run_rec("idle"), [])
    log = backend.log()
    assert log.runs() == [run_rec("idle")]
    assert list(log.steps()) == [] and log.actors() == []


def test_streaming_across_chunks(backend: Backend) -> None:
    """More steps than one read chunk, read lazily and by two iterators at once."""
    run, steps = expected(requests=CHUNK + 200)
    assert len(steps) > 2 * CHUNK
    backend.write(run, steps)
    log = backend.log()
    it_all = log.steps()
    it_log = log.steps(actor="log/0")
    first = [next(it_all) for _ in range(10)]
    logged = [next(it_log) for _ in range(5)]
    assert encoded(first + list(it_all)) == encoded(steps)
    assert encoded(logged + list(it_log)) == encoded(_select(steps, actor="log/0"))
    it_abandoned = log.steps()
    next(it_abandoned)
    it_abandoned.close()  # releases its cursor
    assert encoded(list(log.steps(since=100.0, until=200.0))) == encoded(
        _select(steps, since=100.0, until=200.0)
    )


def test_outbox_on_commit_tickets(backend: Backend) -> None:
    run, steps = expected()
    sink = backend.sink("outbox")
    seen: list[int] = []
    sink.on_commit = seen.append
    sink.begin_run(run)
    tickets = [sink.append(s) for s in steps]
    sink.flush()
    assert tickets == list(range(1, len(steps) + 1))
    assert sink.committed_ticket == len(steps)
    assert seen == sorted(seen) and seen[-1] == len(steps)
    assert encoded(list(backend.log().steps())) == encoded(steps)  # committed = readable
    sink.close()


def test_sqlite_file_is_wal(backend: Backend) -> None:
    if not backend.kind.startswith("sqlite"):
        pytest.skip("SQLite only")
    backend.write(run_rec("w"), edge_steps())
    import sqlite3

    conn = sqlite3.connect(backend.target)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    if backend.kind in ROW_KINDS:
        assert os.path.getsize(backend.target) > 1 << 20  # the 1 MiB payload is in the file
        return
    # Both writers store each page as a zstd frame (pages.py): the 1 MiB payload
    # (256 byte values repeated) is in the file, in a few KiB
    pages = conn.execute("SELECT id, body, crc32 FROM pages").fetchall()
    assert pages and {body[:4] for _, body, _ in pages} == {ZSTD_MAGIC}
    assert sum(len(body) for _, body, _ in pages) < 1 << 16
    assert sum(len(checked_body("t", "w", page)) for page in pages) > 1 << 20
