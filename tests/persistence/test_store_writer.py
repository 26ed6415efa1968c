"""The group-commit writer: tickets, on_commit, backpressure, failures, lifecycle."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from store_testdata import edge_steps, encoded, run_rec

from deepserve.core.records import InputRec, RunRec, Step
from deepserve.persistence import GroupCommitSink, LogError, open_log, open_sink


def _step(i: int, actor: str = "a/1", hlc: int | None = None) -> Step:
    inp = InputRec(
        actor, i, float(i), i if hlc is None else hlc, 0, "ext/x", i, None, None, True, "T", b"p"
    )
    return Step(inp, (), ())


class GatedStore:
    """A fake backend whose transactions of steps wait for the test to open a gate
    (a run record alone passes: `begin_run` waits for its commit)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.batches: list[int] = []

    def write(self, items: Sequence[Step | RunRec]) -> int:
        if any(type(i) is Step for i in items):
            self.gate.wait()
        self.batches.append(len(items))
        return sum(1 for i in items if type(i) is Step)

    def close(self) -> None:
        return None


def test_tickets_from_several_threads(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "t.db"), "outbox")
    seen: list[int] = []
    sink.on_commit = seen.append
    sink.begin_run(run_rec("r"))
    tickets: list[list[int]] = [[] for _ in range(4)]

    def work(k: int) -> None:
        for i in range(1500):
            tickets[k].append(sink.append(_step(i, actor=f"w/{k}")))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sink.close()
    assert all(ts == sorted(ts) for ts in tickets)
    assert sorted(t for ts in tickets for t in ts) == list(range(1, 6001))
    assert seen == sorted(seen) and seen[-1] == 6000 == sink.committed_ticket
    log = open_log(str(tmp_path / "t.db"))
    per_actor = {a: [s.input.seq for s in log.steps(actor=a)] for a in log.actors()}
    assert per_actor == {f"w/{k}": list(range(1500)) for k in range(4)}  # append order kept


def test_backpressure_blocks_append_when_queue_is_full() -> None:
    store = GatedStore()
    sink = GroupCommitSink(lambda: store, label="gated", max_pending=4, max_batch=2)
    sink.begin_run(run_rec("r"))
    done: list[int] = []
    t = threading.Thread(target=lambda: [done.append(sink.append(_step(i))) for i in range(50)])
    t.start()
    time.sleep(0.2)
    # one batch in flight (2 steps) and a full queue; the appender waits
    assert len(done) <= 4 + 2 and t.is_alive()
    store.gate.set()
    t.join(5)
    sink.close()
    assert done == list(range(1, 51))
    assert max(store.batches) <= 2 and sink.committed_ticket == 50


def test_flush_and_wait_committed() -> None:
    store = GatedStore()
    sink = GroupCommitSink(lambda: store, label="gated")
    sink.begin_run(run_rec("r"))
    ticket = sink.append(_step(1))
    assert sink.wait_committed(ticket, timeout=0.05) is False
    store.gate.set()
    assert sink.wait_committed(ticket, timeout=5) is True
    sink.append(_step(2))
    sink.flush()
    assert sink.committed_ticket == 2
    sink.close()
    sink.close()  # idempotent
    with pytest.raises(LogError, match="closed"):
        sink.append(_step(3))


def test_append_before_begin_run(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "x.db"))
    with pytest.raises(LogError, match="append\\(\\) before begin_run\\(\\)"):
        sink.append(_step(1))
    sink.close()


def test_writer_failure_surfaces_as_one_line(tmp_path: Path) -> None:
    p = str(tmp_path / "x.db")
    sink = open_sink(p, layout="rows")  # (a page stores any msgpack integer)
    sink.begin_run(run_rec("r"))
    sink.append(_step(1, hlc=2**63))  # does not fit a 64-bit column
    with pytest.raises(LogError) as info:
        sink.flush()
    msg = str(info.value)
    assert msg.startswith(f"{p}: log writer failed: OverflowError") and "\n" not in msg
    with pytest.raises(LogError, match="log writer failed"):
        sink.append(_step(2))
    with pytest.raises(LogError, match="log writer failed"):
        sink.close()
    assert list(open_log(p).steps()) == []  # the failed transaction left nothing behind


def test_on_commit_that_raises_stops_the_sink(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "x.db"), "outbox")

    def boom(ticket: int) -> None:
        raise RuntimeError("driver bug")

    sink.on_commit = boom
    sink.begin_run(run_rec("r"))
    sink.append(_step(1))
    with pytest.raises(LogError, match="on_commit callback raised RuntimeError: driver bug"):
        sink.flush()
    with pytest.raises(LogError):
        sink.close()


def test_store_that_cannot_open() -> None:
    def broken() -> Any:
        raise OSError("disk on fire")

    with pytest.raises(LogError, match="^lbl: cannot open the log: OSError: disk on fire$"):
        GroupCommitSink(broken, label="lbl")


def test_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        open_sink(str(tmp_path / "x.db"), "sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="synchronous"):
        open_sink(str(tmp_path / "x.db"), synchronous="eventually")


def test_directory_target_writes_one_file_per_process(tmp_path: Path) -> None:
    for proc in ("te/1", "te-0"):
        with open_sink(str(tmp_path), process=proc, synchronous="full") as sink:
            sink.begin_run(run_rec("r", process=proc))
            for s in edge_steps():
                sink.append(s)
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["te-0.db", "te_1.db"]
    log = open_log(str(tmp_path / "te_1.db"))
    assert encoded(list(log.steps())) == encoded(edge_steps())


def test_postgres_writer_failure(postgres_url: str) -> None:
    sink = open_sink(postgres_url, "outbox")
    sink.begin_run(run_rec("r"))
    sink.append(_step(1, hlc=2**63))
    with pytest.raises(LogError, match="log writer failed"):
        sink.flush()
    with pytest.raises(LogError):
        sink.close()


def test_on_commit_may_append_from_the_writer_thread(tmp_path: Path) -> None:
    """A driver releasing outputs inside on_commit may append more: no self-deadlock,
    even with a tiny queue bound."""
    sink = open_sink(str(tmp_path / "x.db"), "outbox", max_pending=2, max_batch=1)
    follow_ups: list[int] = []

    def on_commit(ticket: int) -> None:
        if len(follow_ups) < 20:
            follow_ups.append(sink.append(_step(1000 + ticket)))

    sink.on_commit = on_commit
    sink.begin_run(run_rec("r"))
    for i in range(5):
        sink.append(_step(i))
    deadline = time.monotonic() + 5
    while len(follow_ups) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    sink.close()
    assert len(follow_ups) == 20
    assert sum(1 for _ in open_log(str(tmp_path / "x.db")).steps()) >= 25


def test_close_releases_a_blocked_appender() -> None:
    store = GatedStore()
    sink = GroupCommitSink(lambda: store, label="gated", max_pending=1, max_batch=1)
    sink.begin_run(run_rec("r"))
    errors: list[str] = []

    def fill() -> None:
        try:
            for i in range(10):
                sink.append(_step(i))
        except LogError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=fill)
    t.start()
    time.sleep(0.1)
    closer = threading.Thread(target=sink.close)
    closer.start()
    t.join(5)
    assert errors == ["gated: the log sink is closed"]
    store.gate.set()
    closer.join(5)
    assert not closer.is_alive()


def test_reader_can_move_to_another_thread(tmp_path: Path) -> None:
    p = str(tmp_path / "x.db")
    with open_sink(p) as sink:
        sink.begin_run(run_rec("r"))
        sink.append(_step(1))
    log = open_log(p)
    got: list[int] = []
    t = threading.Thread(target=lambda: got.extend(s.input.seq for s in log.steps()))
    t.start()
    t.join(5)
    assert got == [1]


def test_two_writers_on_one_file(tmp_path: Path) -> None:
    """One writer per process is the design; two on one file (a misconfiguration) still
    get distinct step ids because ids are taken under SQLite's write lock."""
    p = str(tmp_path / "shared.db")
    sinks = [open_sink(p, max_batch=7) for _ in range(2)]

    def work(k: int) -> None:
        sinks[k].begin_run(run_rec(f"run-{k}"))
        for i in range(500):
            sinks[k].append(_step(i, actor=f"w/{k}"))
        sinks[k].close()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log = open_log(p)
    for k in range(2):
        assert [s.input.seq for s in log.steps(f"run-{k}")] == list(range(500))
