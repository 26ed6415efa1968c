"""The functional core: row conversion, header checks, target parsing, chunking."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from store_testdata import edge_steps, encoded, expected, run_rec

from deepserve.persistence import LogError
from deepserve.persistence.bench import measure_store
from deepserve.persistence.rows import batch_rows, id_range_is_dense, join_steps
from deepserve.persistence.schema import INSERT_COLUMNS, check_columns
from deepserve.persistence.sqlite_writer import chunk_sizes
from deepserve.persistence.target import SQLITE_MAGIC, header_problem, parse_target


def test_schema_has_a_column_for_every_record_field() -> None:
    assert check_columns() == []


def test_rows_round_trip() -> None:
    run, steps = expected()
    steps = steps + edge_steps()
    rows = batch_rows([run, *steps], None, itertools.count(100))
    assert rows.runs == [tuple(getattr(run, f) for f in run.__struct_fields__)]
    assert rows.run_id == run.run_id and rows.steps == len(steps)
    assert all(len(r) == len(INSERT_COLUMNS["outputs"]) for r in rows.outputs)
    back = join_steps(
        [(r[0], *r[2:]) for r in rows.inputs],  # (id, *fields): drop run_id as a reader selects
        [(r[0], *r[2:]) for r in rows.events],
        [(r[0], *r[2:]) for r in rows.outputs],
        [(r[0], *r[2:]) for r in rows.snapshots],
    )
    assert encoded(back) == encoded(steps)


def test_join_skips_children_of_unselected_steps() -> None:
    steps = edge_steps()
    rows = batch_rows([run_rec("r"), *steps], None, itertools.count(1))
    chosen = [(r[0], *r[2:]) for r in rows.inputs if r[0] != 2]  # step 2 filtered out
    back = join_steps(
        chosen,
        [(r[0], *r[2:]) for r in rows.events],
        [(r[0], *r[2:]) for r in rows.outputs],
        [(r[0], *r[2:]) for r in rows.snapshots],
    )
    assert encoded(back) == encoded([steps[0], steps[2], steps[3]])


def test_step_before_any_run_is_refused() -> None:
    with pytest.raises(ValueError, match="before begin_run"):
        batch_rows(edge_steps(), None, itertools.count(1))


def test_dense_ranges() -> None:
    assert id_range_is_dense([5, 6, 7]) and id_range_is_dense([1, 3, 5])
    assert not id_range_is_dense([1, 100]) and not id_range_is_dense([])


@pytest.mark.parametrize("n", [0, 1, 7, 2047, 2048, 2049, 10_000])
def test_chunk_sizes(n: int) -> None:
    sizes = chunk_sizes(n, 2048)
    assert (
        sum(sizes) == n and all(s & (s - 1) == 0 for s in sizes) and max(sizes, default=0) <= 2048
    )


def _header(page_size: int = 4096, pages: int = 10, valid: bool = True) -> bytes:
    h = bytearray(100)
    h[:16] = SQLITE_MAGIC
    h[16:18] = (1 if page_size == 65536 else page_size).to_bytes(2, "big")
    h[24:28] = (5).to_bytes(4, "big")
    h[28:32] = pages.to_bytes(4, "big")
    h[92:96] = (5 if valid else 4).to_bytes(4, "big")
    return bytes(h)


def test_header_problems() -> None:
    assert header_problem(_header(), 40960, False) is None
    assert header_problem(_header(), 40960 - 4096, False) == (
        "truncated: 36864 bytes, but its header says 10 pages of 4096 bytes"
    )
    assert header_problem(_header(), 4096, True) is None  # pages may still be in the WAL
    assert header_problem(_header(valid=False), 4096, False) is None  # stale count: trust size
    assert "whole number" in header_problem(_header(valid=False), 5000, False)  # type: ignore[operator]
    assert header_problem(_header(65536, 2), 65536 * 2, False) is None
    assert "page size" in header_problem(_header(1000), 4000, False)  # type: ignore[operator]
    assert header_problem(b"", 0, False) == "empty file (0 bytes), not a deepserve log"
    assert header_problem(SQLITE_MAGIC[:10], 10, False) == (
        "truncated: 10 bytes, shorter than the 100-byte SQLite header"
    )
    assert "bad file header" in header_problem(b"PK\x03\x04" + bytes(96), 4096, False)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("target", "kind", "where"),
    [
        ("run.db", "sqlite", "run.db"),
        ("/abs/dir", "sqlite", "/abs/dir"),
        ("sqlite:///rel.db", "sqlite", "rel.db"),
        ("sqlite:////abs/x.db", "sqlite", "/abs/x.db"),
        ("postgresql://u:pw@h:5/db", "postgresql", "postgresql+asyncpg://u:pw@h:5/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql", "postgresql+asyncpg://u@h/db"),
        ("postgres://u@h/db", "postgresql", "postgresql+asyncpg://u@h/db"),
    ],
)
def test_parse_target(target: str, kind: str, where: str) -> None:
    t = parse_target(target)
    assert t.kind == kind
    assert (t.path if kind == "sqlite" else t.url) == where
    assert "pw" not in t.label


def test_parse_target_rejects() -> None:
    with pytest.raises(LogError, match="not a valid database URL"):
        parse_target("postgresql://u@h:port/db")


def test_measure_store_smoke(tmp_path: Path) -> None:
    out = measure_store(3000, str(tmp_path / "bench"))
    assert out["backend"] == "sqlite" and out["records"] >= 3 * 3000 - 30
    for key in ("async_rps", "outbox_rps", "raw_rps", "read_rps", "async_vs_raw"):
        assert out[key] > 0
    assert not (tmp_path / "bench").exists()  # created for the run, removed after


def test_sqlite_reads_a_whole_run_without_sorting(tmp_path: Path) -> None:
    """The unfiltered read streams in rowid order (no temp b-tree before row one)."""
    import sqlite3

    from sqlalchemy import select
    from sqlalchemy.dialects import sqlite

    from deepserve.persistence import open_sink
    from deepserve.persistence.reader import _INPUT_COLS, input_filter
    from deepserve.persistence.schema import inputs

    p = str(tmp_path / "plan.db")
    open_sink(p).close()
    stmt = select(*_INPUT_COLS).where(*input_filter("r", None, None, None, None))
    sql = str(stmt.order_by(inputs.c.id).compile(dialect=sqlite.dialect()))
    plan = " ".join(r[3] for r in sqlite3.connect(p).execute("EXPLAIN QUERY PLAN " + sql, ("r",)))
    assert plan == "SCAN inputs"
