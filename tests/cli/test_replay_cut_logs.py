"""A log whose last steps are gone is not a clean run (issue 29, §2). Every writer stores a
closing record when it closes its log (schema v7: steps, units and a running digest), so every
replay command tells a run that ended cleanly (answers, exit 0), a run whose process died (no
closing record: one line on stderr; `verify` exits 3, "identical as far as the log goes"), and a
log cut after its end was written (refused: exit 2, one line)."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from cliproc import deepserve
from kernel_actors import Add, Counter

from deepserve.cli.main import main
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.persistence import open_log, open_sink

READS = (("verify",), ("state", "--actor", "c/0"), ("log",), ("digest",))
SIM_READS = (("verify",), ("state", "--actor", "workload"), ("log",), ("digest",), ("why", "r1"))
CUT = "was closed with {n:,} steps, but it holds {held}: the log was cut after its end was written"
NOTE = "the run has no closing record: its writer never closed the log (the process died, or still runs)"


async def _daemon_style_run(log: str, adds: int, layout: str) -> None:
    """An `AsyncDriver` on the wall clock writing through the thread writer, as the daemon does
    (in pages; rows: the other layout), then closed as the daemon closes it at shutdown."""
    # (at most 32 steps a transaction: several pages, so that deleting the last leaves some)
    sink = open_sink(log, "async", layout=layout, max_batch=32)  # type: ignore[arg-type]
    async with AsyncDriver(seed=3, sink=sink) as d:
        d.spawn("c/0", Counter)
        d.spawn("c/1", Counter)
        for i in range(adds):
            await d.inject(f"c/{i % 2}", Add(i))
        await d.idle()
    sink.close()


@pytest.fixture(scope="module", params=["pages", "rows"])
def daemon_log(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    path = tmp_path_factory.mktemp("daemon") / "daemon.db"
    anyio.run(_daemon_style_run, str(path), 200, request.param)
    return path


@pytest.fixture(scope="module")
def sim_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulation's log in three pages (`sim` stores ~1,000 steps a page), TEs behind the
    workload dispatcher: its last page holds the last arrivals (what the cut tests cut off)."""
    where = tmp_path_factory.mktemp("sim")
    res = deepserve("sim", "pd-1p1d", "--requests", "100", "--log", "pd.db", "--set", "scheduling.entry=dispatcher",
                    cwd=where)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return where / "pd.db"


def _copy(src: Path, dst: Path, *statements: str) -> Path:
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as db:
        for sql in statements:
            db.execute(sql)
    return dst


class Res:
    """What a replay command did, run in this process (the process boundary is not what is tested)."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


Run = Callable[[Path, tuple[str, ...]], Res]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    def _run(log: Path, command: tuple[str, ...]) -> Res:
        capsys.readouterr()
        code = main(["replay", command[0], str(log), *command[1:]])
        out = capsys.readouterr()
        return Res(code, out.out, out.err)

    return _run


def assert_one_line_error(res: Res, *needles: str) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout[:500], res.stderr[-2000:])
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _steps(log: Path) -> int:
    with open_log(str(log)) as reader:
        return sum(1 for _ in reader.steps())


def test_a_clean_daemon_log_answers_without_a_word(run: Run, daemon_log: Path) -> None:
    for command in READS:
        res = run(daemon_log, command)
        assert res.returncode == 0 and res.stderr == "", (command, res.stderr)
    assert run(daemon_log, ("verify",)).stdout.startswith("identical: 2 actors, ")


def test_a_daemon_log_without_its_last_steps_is_refused(run: Run, daemon_log: Path, tmp_path: Path) -> None:
    """Its last 50 input rows, or its last page, deleted."""
    n = _steps(daemon_log)
    with sqlite3.connect(daemon_log) as db:
        last = db.execute("SELECT steps FROM pages ORDER BY id DESC LIMIT 1").fetchone()
    if last is None:  # the row layout
        cut, held = _copy(daemon_log, tmp_path / "cut.db",
                          "DELETE FROM inputs WHERE id IN (SELECT id FROM inputs ORDER BY id DESC LIMIT 50)"), n - 50  # fmt: skip
    else:
        cut = _copy(daemon_log, tmp_path / "cut.db", "DELETE FROM pages WHERE id = (SELECT max(id) FROM pages)")
        held = n - last[0]
    for command in READS:
        assert_one_line_error(run(cut, command), CUT.format(n=n, held=f"{held:,}"))


def test_a_sim_log_without_its_last_page_is_refused(run: Run, sim_log: Path, tmp_path: Path) -> None:
    n = _steps(sim_log)
    with sqlite3.connect(sim_log) as db:
        ((last,),) = db.execute("SELECT steps FROM pages ORDER BY id DESC LIMIT 1")
    cut = _copy(sim_log, tmp_path / "cut.db", "DELETE FROM pages WHERE id = (SELECT max(id) FROM pages)")
    for command in SIM_READS:
        assert_one_line_error(run(cut, command), CUT.format(n=n, held=f"{n - last:,}"))


def test_a_sim_log_with_every_page_deleted_is_refused(run: Run, sim_log: Path, tmp_path: Path) -> None:
    """It was `identical: 0 actors, 0 inputs` with exit 0."""
    n = _steps(sim_log)
    cut = _copy(sim_log, tmp_path / "empty.db", "DELETE FROM pages")
    for command in SIM_READS:
        assert_one_line_error(run(cut, command), CUT.format(n=n, held="none of them"))


def test_a_log_whose_process_died_says_so_and_verifies_as_far_as_it_goes(run: Run, sim_log: Path, tmp_path: Path) -> None:
    """What a process that died leaves: its last steps never written, and no closing record."""
    died = _copy(sim_log, tmp_path / "died.db", "DELETE FROM run_ends",
                 "DELETE FROM pages WHERE id = (SELECT max(id) FROM pages)")  # fmt: skip
    res = run(died, ("verify",))
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stdout.startswith("identical as far as the log goes: ") and "no closing record" in res.stdout
    for command in SIM_READS[1:-1]:
        res = run(died, command)
        assert res.returncode == 0, (command, res.stderr)
        assert res.stderr.count("\n") == 1 and NOTE in res.stderr, (command, res.stderr)
    early = run(died, ("why", "r1"))  # in the log: answered, with the note
    assert early.returncode == 0 and early.stdout.startswith("request r1: ") and NOTE in early.stderr
    # a request cut off the log: not "no request" (as if it never arrived), but the log ends before it
    late = run(died, ("why", "r99"))
    assert_one_line_error(late, "request 'r99' is not in the log, which ends before it could tell",
                          "no closing record", "may have arrived after its last step")
    assert run(sim_log, ("why", "r99")).returncode == 0


def test_a_closing_record_edited_to_match_a_cut_is_refused(run: Run, sim_log: Path, tmp_path: Path) -> None:
    """Its row is checksummed like every other: lowering its count to hide a deleted page shows."""
    with sqlite3.connect(sim_log) as db:
        ((last,),) = db.execute("SELECT steps FROM pages ORDER BY id DESC LIMIT 1")
    cut = _copy(sim_log, tmp_path / "edited.db", "DELETE FROM pages WHERE id = (SELECT max(id) FROM pages)",
                f"UPDATE run_ends SET steps = steps - {last}, units = units - 1")  # fmt: skip
    assert_one_line_error(run(cut, ("verify",)), "damaged log: the closing record of run 'sim-0' does not "
                          "match its checksum")  # fmt: skip
