"""The writer process (`open_sink(..., writer="process")`): round trip, flush
durability, backpressure, failures on either side of the pipe, no orphans."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import msgspec
import pytest
import zstandard
from store_testdata import edge_steps, encoded, expected, run_rec

from deepserve.core.records import InputRec, Step
from deepserve.persistence import LogError, open_log, open_sink
from deepserve.persistence.pages import ZSTD_MAGIC
from deepserve.persistence.sqlite.process_writer import ProcessSink


def _step(i: int, hlc: int | None = None) -> Step:
    inp = InputRec(
        "a/1", i, float(i), i if hlc is None else hlc, 0, "ext/x", i, None, None, True, "T", b"p"
    )
    return Step(inp, (), ())


def _paged_log(tmp_path: Path, steps: int, **sink: int) -> str:
    """A log whose run "r" holds `_step(0)`..`_step(steps - 1)`, written by the writer process."""
    p = str(tmp_path / "x.db")
    with open_sink(p, writer="process", **sink) as s:
        s.begin_run(run_rec("r"))
        for i in range(steps):
            s.append(_step(i))
    return p


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether `pid` has exited (a zombie nobody reaps counts as exited)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/status") as f:
                state = next(line for line in f if line.startswith("State:"))
        except (FileNotFoundError, ProcessLookupError, StopIteration):
            return True
        if state.split()[1] in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def test_round_trip_in_many_small_batches(tmp_path: Path) -> None:
    run, steps = expected(requests=300)
    p = str(tmp_path / "x.db")
    with open_sink(p, writer="process", max_batch=7, max_pending=21) as sink:
        assert isinstance(sink, ProcessSink)
        sink.begin_run(run)
        tickets = [sink.append(s) for s in steps]
        sink.begin_run(run_rec("edge"))
        for s in edge_steps():
            sink.append(s)
    assert tickets == list(range(1, len(steps) + 1))
    assert sink.committed_ticket == len(steps) + len(edge_steps())
    log = open_log(p)
    assert [r.run_id for r in log.runs()] == [run.run_id, "edge"]
    assert encoded(list(log.steps(run.run_id))) == encoded(steps)
    assert encoded(list(log.steps("edge"))) == encoded(edge_steps())
    assert _gone(sink.pid, timeout=0)  # close() waited for the process


def _page(steps: list[Step]) -> tuple[bytes, int, float, float]:
    """`steps` as `append_page` takes them: encoded back to back, their count and time bounds."""
    ts = [s.input.t for s in steps]
    return b"".join(msgspec.msgpack.encode(s) for s in steps), len(steps), min(ts), max(ts)


def test_append_page_writes_what_append_writes(tmp_path: Path) -> None:
    run, steps = expected(requests=300)
    p = str(tmp_path / "x.db")
    with open_sink(p, writer="process", max_batch=64) as sink:
        assert isinstance(sink, ProcessSink) and sink.page_steps == 64
        sink.begin_run(run)
        tickets = [sink.append(s) for s in steps[:5]]  # buffered: they go before the pages
        cuts = [5, 45, 109, 110, 174]  # pages of 40, 64 (full), 1 and 64 steps
        tickets += [sink.append_page(*_page(steps[a:b])) for a, b in zip(cuts, cuts[1:], strict=False)]
        tickets += [sink.append(s) for s in steps[174:]]
        with pytest.raises(ValueError, match="a page holds 1..64"):
            sink.append_page(*_page(steps[:65]))
    assert tickets[:5] == [1, 2, 3, 4, 5] and tickets[5:9] == cuts[1:] and tickets[-1] == len(steps)
    log = open_log(p)
    assert encoded(list(log.steps(run.run_id))) == encoded(steps)
    with sqlite3.connect(p) as db:
        sizes = [n for (n,) in db.execute("SELECT steps FROM pages ORDER BY id")]
    assert sizes[:5] == [5, 40, 64, 1, 64] and sum(sizes) == len(steps) and max(sizes) == 64
    with pytest.raises(LogError, match="closed"):
        sink.append_page(*_page(steps[:1]))


def test_flush_makes_everything_readable(tmp_path: Path) -> None:
    p = str(tmp_path / "x.db")
    sink = open_sink(p, writer="process")
    commits: list[int] = []
    sink.on_commit = commits.append
    sink.begin_run(run_rec("r"))
    for i in range(10):  # far less than a batch: flush must send the buffer
        sink.append(_step(i))
    sink.flush()
    assert sink.committed_ticket == 10 and commits[-1] == 10
    assert [s.input.seq for s in open_log(p).steps()] == list(range(10))  # sink still open
    sink.close()
    sink.close()  # idempotent
    with pytest.raises(LogError, match="closed"):
        sink.append(_step(11))


def test_append_before_begin_run(tmp_path: Path) -> None:
    with open_sink(str(tmp_path / "x.db"), writer="process") as sink:
        with pytest.raises(LogError, match="append\\(\\) before begin_run\\(\\)"):
            sink.append(_step(1))


def test_backpressure_blocks_append(tmp_path: Path) -> None:
    """At most max_pending steps unacknowledged: a stopped writer stops the driver."""
    sink = open_sink(str(tmp_path / "x.db"), writer="process", max_batch=2, max_pending=4)
    sink.begin_run(run_rec("r"))
    sink.flush()  # the process is up and configured
    os.kill(sink.pid, signal.SIGSTOP)
    done: list[int] = []
    t = threading.Thread(target=lambda: [done.append(sink.append(_step(i))) for i in range(50)])
    t.start()
    time.sleep(0.3)
    # two frames in flight, one full buffer, then the appender waits for room
    assert len(done) <= 4 + 2 + 1 and t.is_alive()
    os.kill(sink.pid, signal.SIGCONT)
    t.join(10)
    sink.close()
    assert done == list(range(1, 51))
    assert sum(1 for _ in open_log(str(tmp_path / "x.db")).steps()) == 50


def _failing_pages(path: str) -> None:
    """Make every page insert into `path` fail, as a full disk would."""
    with sqlite3.connect(path) as c:
        c.execute("CREATE TRIGGER full BEFORE INSERT ON pages BEGIN SELECT RAISE(ABORT, 'disk full'); END")


def test_writer_failure_surfaces_as_one_line(tmp_path: Path) -> None:
    p = str(tmp_path / "x.db")
    sink = open_sink(p, writer="process")
    sink.begin_run(run_rec("r"))
    _failing_pages(p)
    sink.append(_step(1))
    with pytest.raises(LogError) as info:
        sink.flush()
    msg = str(info.value)
    assert msg == f"{p}: log writer failed: IntegrityError: disk full"
    with pytest.raises(LogError, match="log writer failed"):
        sink.append(_step(2))
    with pytest.raises(LogError, match="log writer failed"):
        sink.close()
    assert _gone(sink.pid)
    assert list(open_log(p).steps()) == []  # the failed transaction left nothing behind


def test_failure_surfaces_on_a_later_append(tmp_path: Path) -> None:
    """No flush: appends go on until the failed batch's error reaches the driver."""
    p = str(tmp_path / "x.db")
    sink = open_sink(p, writer="process", max_batch=4, max_pending=8)
    sink.begin_run(run_rec("r"))
    _failing_pages(p)
    sink.append(_step(0))
    with pytest.raises(LogError, match="^.*: log writer failed: IntegrityError: disk full"):
        for i in range(1, 100_000):
            sink.append(_step(i))
    with pytest.raises(LogError):
        sink.close()


def test_writer_that_cannot_open(tmp_path: Path) -> None:
    """The file is checked before the process starts; what only the process finds
    (here: a directory where the file should be) arrives on the next call."""
    sink = ProcessSink(str(tmp_path))
    with pytest.raises(LogError, match=f"^{tmp_path}: cannot open the log: OperationalError"):
        sink.begin_run(run_rec("r"))
        sink.flush()
    with pytest.raises(LogError, match="cannot open the log"):
        sink.close()


def test_killed_writer_is_an_error_not_a_hang(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "x.db"), writer="process", max_batch=8)
    sink.begin_run(run_rec("r"))
    sink.flush()
    os.kill(sink.pid, signal.SIGKILL)
    with pytest.raises(
        LogError, match="writer process exited unexpectedly \\(killed by signal 9\\)"
    ):
        for i in range(100_000):
            sink.append(_step(i))
        sink.flush()
    with pytest.raises(LogError, match="killed by signal 9"):
        sink.close()


DRIVER = r"""
import os, sys, time
from deepserve.core.records import InputRec, RunRec, Step
from deepserve.persistence import open_sink

def step(i):
    return Step(InputRec("a/1", i, float(i), i, 0, "ext/x", i, None, None, True, "T", b"x"), (), ())

sink = open_sink(sys.argv[1], "async", writer="process", max_batch=100)
sink.begin_run(RunRec("crash", "sim", 0, "{}", "0", "h", 0.0))
for i in range(1, 5001):
    sink.append(step(i))
sink.flush()
print(sink.pid, flush=True)
for i in range(5001, 5351):  # three more batches sent, fifty steps still buffered
    sink.append(step(i))
print("sent", flush=True)
time.sleep(60)
"""


def test_killed_driver_leaves_no_orphan_and_loses_no_flushed_step(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read().decode() if proc.stderr else ""
    writer_pid = int(line)
    assert proc.stdout.readline() == b"sent\n"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    assert _gone(writer_pid), "the writer process outlived its driver"
    seqs = [s.input.seq for s in open_log(str(path)).steps()]
    assert seqs == list(range(1, len(seqs) + 1))  # a prefix: no holes
    # everything flushed, and the three batches sent since; the buffer died with the driver
    assert len(seqs) == 5300


def test_exit_without_close_still_writes_everything(tmp_path: Path) -> None:
    path = tmp_path / "exit.db"
    code = DRIVER.replace("sink.flush()", "sys.exit(0)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr.decode()
    assert sum(1 for _ in open_log(str(path)).steps()) == 5000


def test_forked_child_leaves_the_sink_to_its_parent(tmp_path: Path) -> None:
    """A bare fork copies the sink: the copy must not write, nor keep the pipe open."""
    p = str(tmp_path / "x.db")
    sink = open_sink(p, writer="process")
    sink.begin_run(run_rec("r"))
    for i in range(10):
        sink.append(_step(i))
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: try to close its copy, then outlive the parent's close
        code = 1
        try:
            sink.close()
        except LogError as exc:
            code = 0 if "belongs to process" in str(exc) else 2
        finally:
            os.read(hold_r, 1)
            os._exit(code)
    closer = threading.Thread(target=sink.close)
    closer.start()
    closer.join(10)
    alive = closer.is_alive()
    os.write(hold_w, b"x")
    _, status = os.waitpid(pid, 0)
    assert not alive, "close() waited for the forked child"
    assert os.waitstatus_to_exitcode(status) == 0
    assert [s.input.seq for s in open_log(p).steps()] == list(range(10))


def test_options(tmp_path: Path) -> None:
    p = str(tmp_path / "x.db")
    with pytest.raises(ValueError, match="async"):
        open_sink(p, "outbox", writer="process")
    with pytest.raises(ValueError, match="writer"):
        open_sink(p, writer="fiber")  # type: ignore[arg-type]


def _indexes(path: str) -> list[str]:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL ORDER BY name"
        ).fetchall()
    finally:
        conn.close()
    return [r[0] for r in rows]


def _count(path: str, table: str) -> int:
    with sqlite3.connect(path) as c:
        return c.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_a_run_written_by_the_process_is_paged_and_reads_as_its_rows_would(tmp_path: Path) -> None:
    """The writer process stores pages (`persistence/pages.py`), the thread writer rows:
    every reader answer is the same, filters, actors and snapshots included."""
    run, steps = expected(requests=200)
    rows_log, paged_log = str(tmp_path / "t.db"), str(tmp_path / "p.db")
    with open_sink(rows_log, layout="rows") as sink:
        sink.begin_run(run)
        for s in steps:
            sink.append(s)
    with open_sink(paged_log, writer="process", max_batch=64) as sink:
        sink.begin_run(run)
        for s in steps:
            sink.append(s)
    assert _count(paged_log, "inputs") == _count(paged_log, "outputs") == 0
    assert _count(paged_log, "pages") == -(-len(steps) // 64) and _count(rows_log, "pages") == 0
    rows, paged = open_log(rows_log), open_log(paged_log)
    mid_t = steps[len(steps) // 2].input.t
    corr = next(s.input.corr for s in steps if s.input.corr is not None)
    for where in ({}, {"actor": steps[-1].input.actor}, {"corr": corr}, {"since": mid_t},
                  {"until": mid_t}, {"since": mid_t, "until": mid_t + 0.5}):
        want = encoded(list(rows.steps(run.run_id, **where)))
        assert want and encoded(list(paged.steps(run.run_id, **where))) == want, where
    assert paged.actors() == rows.actors()
    assert list(paged.snapshots()) == list(rows.snapshots()) != []
    actor = rows.actors()[0]
    assert list(paged.snapshots(actor=actor)) == list(rows.snapshots(actor=actor))
    paged.check_integrity()


def test_page_ids_continue_the_step_ids_of_rows(tmp_path: Path) -> None:
    """Rows and pages draw step ids from one sequence, in either order."""
    p = str(tmp_path / "x.db")
    with open_sink(p, layout="rows") as sink:
        sink.begin_run(run_rec("rows"))
        for i in range(5):
            sink.append(_step(i))
    with open_sink(p, writer="process", max_batch=3) as sink:
        sink.begin_run(run_rec("paged"))
        for i in range(7):
            sink.append(_step(i))
    with open_sink(p, layout="rows") as sink:
        sink.begin_run(run_rec("rows again"))
        sink.append(_step(0))
    with sqlite3.connect(p) as c:
        pages = c.execute("SELECT first_step, steps FROM pages ORDER BY id").fetchall()
        last_row = c.execute("SELECT max(id) FROM inputs").fetchone()[0]
    assert pages == [(6, 3), (9, 3), (12, 1)] and last_row == 13
    log = open_log(p)
    assert [s.input.seq for s in log.steps("paged")] == list(range(7))
    assert [len(list(log.steps(r))) for r in ("rows", "paged", "rows again")] == [5, 7, 1]


def test_a_damaged_page_is_refused_by_every_read_and_by_the_integrity_check(tmp_path: Path) -> None:
    """One byte of a payload changed: the page still decodes (into other steps), and
    SQLite's own check passes; the page's checksum is what tells."""
    p = _paged_log(tmp_path, 10)
    with sqlite3.connect(p) as c:
        (stored,) = c.execute("SELECT body FROM pages").fetchone()
        body = zstandard.ZstdDecompressor().decompress(stored)  # a zstd frame (schema v6)
        at = body.rindex(b"p")  # the last step's one-byte payload
        bad = body[:at] + b"q" + body[at + 1 :]
        c.execute("UPDATE pages SET body = ?", (zstandard.ZstdCompressor().compress(bad),))
    assert [s.input.payload for s in msgspec.msgpack.decode(bad, type=list[Step])][-1] == b"q"
    log = open_log(p)
    want = f"{p}: damaged log: page 1 of run 'r' fails its checksum (its steps cannot be trusted)"
    for read in (log.check_integrity, lambda: list(log.steps()), log.actors,
                 lambda: list(log.snapshots()), lambda: list(log.steps(actor="a/1"))):
        with pytest.raises(LogError) as info:
            read()
        assert str(info.value) == want


@pytest.mark.parametrize(
    ("update", "problem"),
    [
        # a time bound that hides the page from a time range ('replay log --since 3 --until 4')
        ("UPDATE pages SET t_first = 5.0 WHERE id = 1",
         "(its row says 3 steps at t=5..2, its body holds 3 at t=0..2)"),
        ("UPDATE pages SET t_last = 1.0 WHERE id = 2",
         "(its row says 3 steps at t=3..1, its body holds 3 at t=3..5)"),
        ("UPDATE pages SET steps = 2 WHERE id = 2",
         "(its row says 2 steps at t=3..5, its body holds 3 at t=3..5)"),
        # (was "first step >= None" on a run's first page: a comparison with nothing)
        ("UPDATE pages SET first_step = 1 WHERE id = 2",
         "(its row says it starts at step 1, inside the run's previous page (which ends at step 3))"),
    ],
)
def test_a_damaged_page_head_is_refused_by_the_integrity_check(tmp_path: Path, update: str,
                                                                problem: str) -> None:  # fmt: skip
    """The checksum covers a page's body; the head beside it (steps, time bounds, first step)
    is what a time range selects pages by, without decoding them. Damaged, it hid a page from
    `replay log --since/--until` and moved `replay state --at`, with exit 0."""
    p = _paged_log(tmp_path, 9, max_batch=3)
    log = open_log(p)
    log.check_integrity()  # intact
    assert len(list(log.steps(since=3.0, until=4.0))) == 2
    log.close()
    with sqlite3.connect(p) as c:
        c.execute(update)
    with pytest.raises(LogError) as info:
        open_log(p).check_integrity()
    assert "damaged log: page" in str(info.value) and problem in str(info.value)
    cli = subprocess.run([sys.executable, "-m", "deepserve", "replay", "log", p, "--since", "3",
                          "--until", "4"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cli.returncode == 2 and cli.stdout == ""
    assert cli.stderr.count("\n") == 1 and "does not match its steps" in cli.stderr


def test_a_log_with_runs_keeps_its_indexes_while_a_process_writes(tmp_path: Path) -> None:
    p = str(tmp_path / "x.db")
    with open_sink(p, layout="rows") as sink:
        sink.begin_run(run_rec("first"))
        sink.append(_step(0))
    before = _indexes(p)
    sink = open_sink(p, writer="process")
    sink.begin_run(run_rec("second"))
    sink.append(_step(1))
    sink.flush()
    assert _indexes(p) == before  # readers of the first run keep their indexes
    sink.close()
    assert _indexes(p) == before


@pytest.mark.parametrize(
    ("record", "error"),
    [
        # neither a step nor anything msgpack encodes
        (object(), "AttributeError: 'object' object has no attribute 'input'"),
        # encodable, but not a step: the page's head cannot be read from it
        (7, "AttributeError: 'int' object has no attribute 'input'"),
    ],
)
def test_a_record_that_is_not_a_step_is_a_log_error(
    tmp_path: Path, record: object, error: str
) -> None:
    """As with the thread writer: what cannot become a page fails the sink in one line."""
    p = str(tmp_path / "x.db")
    sink = open_sink(p, writer="process")
    sink.begin_run(run_rec("r"))
    sink.append(_step(0))
    sink.append(record)  # type: ignore[arg-type]
    with pytest.raises(LogError) as info:
        sink.flush()
    assert str(info.value) == f"{p}: log writer failed: {error}"
    with pytest.raises(LogError):
        sink.close()
    assert _count(p, "pages") == 0


def test_a_filter_decodes_in_full_only_the_pages_it_selects_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepserve.persistence import pages

    p = str(tmp_path / "x.db")
    with open_sink(p, writer="process", max_batch=10) as sink:
        sink.begin_run(run_rec("r"))
        for i in range(100):  # ten pages; correlation id "c35" only in the fourth
            inp = InputRec("a/1", i, float(i), i, 0, "ext/x", i, f"c{i}", None, True, "T", b"p")
            sink.append(Step(inp, (), ()))
    full: list[int] = []

    class Counting:
        def decode(self, body: bytes) -> list[Step]:
            full.append(len(body))
            return msgspec.msgpack.decode(body, type=list[Step])

    monkeypatch.setattr(pages, "_STEPS", Counting())
    log = open_log(p)
    assert [s.input.seq for s in log.steps(corr="c35")] == [35] and len(full) == 1
    assert [s.input.seq for s in log.steps(since=41.5, until=58)] == list(range(42, 59))
    assert len(full) == 1 + 2  # the pages of steps 40-49 and 50-59 (time bounds skip the rest)
    assert len(list(log.steps())) == 100 and len(full) == 3 + 10


def test_a_log_the_writer_process_creates_has_64_kib_pages_and_others_keep_theirs(tmp_path: Path) -> None:
    paged, rows = str(tmp_path / "paged.db"), str(tmp_path / "rows.db")
    for path, writer in ((paged, "process"), (rows, "thread")):
        with open_sink(path, writer=writer) as sink:  # type: ignore[arg-type]
            sink.begin_run(run_rec(writer))
            for i in range(3):
                sink.append(_step(i))
    sizes = {}
    for path in (paged, rows):
        with sqlite3.connect(path) as db:
            sizes[path] = db.execute("PRAGMA page_size").fetchone()[0]
    assert sizes == {paged: 65536, rows: 4096}
    with open_sink(rows, writer="process") as sink:  # an existing log keeps its page size
        sink.begin_run(run_rec("later"))
    with sqlite3.connect(rows) as db:
        assert db.execute("PRAGMA page_size").fetchone()[0] == 4096
    assert [s.input.seq for s in open_log(paged).steps()] == [0, 1, 2]


def test_pages_count_as_pending_until_acknowledged(tmp_path: Path) -> None:
    _, steps = expected(requests=100)
    with open_sink(str(tmp_path / "x.db"), writer="process", max_batch=64) as sink:
        sink.begin_run(run_rec("p"))
        sink.append_page(*_page(steps[:64]))
        assert sink.statistics().peak_pending == 64  # the lock keeps the ack out until it is noted


def test_pages_are_acknowledged_every_half_window_and_a_waiter_asks_for_the_rest(
    tmp_path: Path,
) -> None:
    """The writer acknowledges every `max_frames // 2` frames (an acknowledgement a page
    cost the driver its reader thread's GIL traffic), so `committed` lags until someone
    waits: `flush` and the edge's `wait_for_room` ask, and never wait for ever."""
    import anyio

    p = str(tmp_path / "x.db")
    # 16 frames of room, an acknowledgement every 8; under pressure from 8 pending steps
    sink = open_sink(p, writer="process", max_batch=4, max_pending=64, high_water=8)
    sink.begin_run(run_rec("r"))  # acknowledged at once: frame 1
    for i in range(12):  # three pages: frames 2..4, none acknowledged yet
        sink.append(_step(i))
    sink.append(_step(12))  # sends the third full page, buffers this one
    time.sleep(0.3)  # the writer has committed the pages by now, and said nothing
    stats = sink.statistics()
    assert (stats.committed, stats.transactions) == (0, 1)  # only the run
    assert sink.under_pressure

    async def wait() -> None:
        with anyio.fail_after(10):  # without the SYNC this waits for ever
            await sink.wait_for_room()

    anyio.run(wait)
    stats = sink.statistics()
    assert (stats.committed, stats.transactions) == (12, 4)  # the buffered step is pending
    for i in range(13, 45):  # pages of frames 6..13 (the SYNC was frame 5): the 8th is acknowledged
        sink.append(_step(i))
    deadline = time.monotonic() + 10
    while sink.statistics().transactions < 12 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (sink.statistics().committed, sink.statistics().transactions) == (44, 12)
    sink.flush()
    assert (sink.committed_ticket, sink.statistics().transactions) == (45, 13)
    sink.close()
    assert [s.input.seq for s in open_log(p).steps()] == list(range(45))


def test_the_writer_checkpoints_as_it_goes_so_close_has_little_to_copy(tmp_path: Path) -> None:
    """The process writer's logs have 64 KiB pages; at SQLite's default checkpoint
    (1,000 pages) the WAL would hold 64 MB that `close()` then waits to copy back."""
    p = str(tmp_path / "x.db")
    sink = open_sink(p, writer="process", max_batch=64)
    sink.begin_run(run_rec("r"))
    for i in range(3000):  # ~12 MB of payloads, in pages of ~256 KB
        inp = InputRec("a/1", i, float(i), i, 0, "ext/x", i, None, None, True, "T", bytes(4096))
        sink.append(Step(inp, (), ()))
    sink.flush()
    wal_bytes = os.path.getsize(p + "-wal")
    sink.close()
    assert wal_bytes < 5 * 2**20  # the default's 4 MB (64 pages), plus the page in flight
    assert sum(1 for _ in open_log(p).steps()) == 3000


def test_pages_are_zstd_frames_and_msgpack_pages_still_read(tmp_path: Path) -> None:
    """Schema v6: the writer process stores each page as a zstd frame; a page stored as bare
    msgpack (every page before v6) reads as before, beside compressed ones in one run."""
    p = _paged_log(tmp_path, 8, max_batch=4)
    with sqlite3.connect(p) as c:
        stored = c.execute("SELECT id, body FROM pages ORDER BY id").fetchall()
        assert [body[:4] for _, body in stored] == [ZSTD_MAGIC, ZSTD_MAGIC]
        plain = zstandard.ZstdDecompressor().decompress(stored[0][1])
        c.execute("UPDATE pages SET body = ?, crc32 = ? WHERE id = ?", (plain, zlib.crc32(plain), stored[0][0]))
        c.execute("DELETE FROM run_ends")  # its closing record summed the page as it was stored
    log = open_log(p)
    log.check_integrity()
    assert [s.input.seq for s in log.steps()] == list(range(8))


def test_a_page_that_does_not_decompress_is_a_damaged_log(tmp_path: Path) -> None:
    """A frame damaged and its checksum made to match: the read names the page, not zstd."""
    p = _paged_log(tmp_path, 3)
    with sqlite3.connect(p) as c:
        (stored,) = c.execute("SELECT body FROM pages").fetchone()
        bad = stored[:8] + bytes(len(stored) - 8)  # the frame header kept, its blocks zeroed
        c.execute("UPDATE pages SET body = ?, crc32 = ?", (bad, zlib.crc32(bad)))
    log = open_log(p)
    with pytest.raises(LogError, match=r"x.db: damaged log: page 1 of run 'r' does not decompress"):
        list(log.steps())
