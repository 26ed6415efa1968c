"""Run ids are unique per log: a second run with the id (and process) of one already
in the log is refused at `begin_run`, before anything of it is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from store_testdata import expected

from deepserve.core.records import RunRec, Step
from deepserve.persistence import LogError, MemoryStore, open_log, open_sink


def _write(target: str, run: RunRec, steps: list[Step], **kw: Any) -> None:
    with open_sink(target, **kw) as sink:
        sink.begin_run(run)
        for s in steps:
            sink.append(s)


def _refused(target: str, run: RunRec, **kw: Any) -> str:
    sink = open_sink(target, **kw)
    with pytest.raises(LogError) as info:
        sink.begin_run(run)
    with pytest.raises(LogError, match="already in this log|closed"):  # the sink is done
        sink.append(expected()[1][0])
    return str(info.value)


def _check_second_run_refused(target: str, label: str, **kw: Any) -> None:
    run, steps = expected(run_id="dup")
    _write(target, run, steps, **kw)
    msg = _refused(target, msgspec.structs.replace(run, started_at=run.started_at + 1), **kw)
    assert msg == (
        f"{label}: run 'dup' (process 'main') is already in this log; "
        "give the run another id, or use another log"
    )
    other = msgspec.structs.replace(run, run_id="other")
    _write(target, other, steps[:5], **kw)  # another id is fine, in the same log
    with open_log(target) as log:
        assert [r.run_id for r in log.runs()] == ["dup", "other"]
        assert len(list(log.steps("dup"))) == len(steps)  # nothing added to the first


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_sqlite_refuses_a_run_id_already_in_the_file(tmp_path: Path, writer: str) -> None:
    path = str(tmp_path / "run.db")
    _check_second_run_refused(path, path, writer=writer)


def test_postgresql_refuses_a_run_id_already_in_the_database(postgres_url: str) -> None:
    label = postgres_url.split("://", 1)[1]
    _check_second_run_refused(postgres_url, f"postgresql+asyncpg://{label}", durability="outbox")


def test_postgresql_one_run_may_span_processes(postgres_url: str) -> None:
    """Daemon processes share one database: the same run id, one process each."""
    run, steps = expected(run_id="cluster")
    _write(postgres_url, msgspec.structs.replace(run, process="p0"), steps[:3])
    _write(postgres_url, msgspec.structs.replace(run, process="p1"), steps[3:6])
    _refused(postgres_url, msgspec.structs.replace(run, process="p1"))
    with open_log(postgres_url) as log:
        assert sorted(r.process for r in log.runs()) == ["p0", "p1"]


def test_memory_store_refuses_a_run_id_it_holds() -> None:
    run, _ = expected(run_id="dup")
    store = MemoryStore()
    store.begin_run(run)
    with pytest.raises(LogError, match="run 'dup' \\(process 'main'\\) is already in this log"):
        store.begin_run(run)
    store.begin_run(msgspec.structs.replace(run, process="p1"))
    assert len(store.runs) == 2
