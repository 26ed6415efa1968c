"""The functional core: row conversion, header checks, target parsing, chunking."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from msgspec.structs import astuple
from store_testdata import edge_steps, encoded, expected

from deepserve.benchmarks.store import measure_store
from deepserve.core.records import Step
from deepserve.persistence import LogError
from deepserve.persistence.rows import (
    STEP_TABLES,
    group_steps,
    id_range_is_dense,
    ints_for_bools,
    rows_of,
    step_rows,
)
from deepserve.persistence.schema import INSERT_COLUMNS, check_columns
from deepserve.persistence.sqlite.files import SQLITE_MAGIC, header_problem
from deepserve.persistence.sqlite.sql import chunk_sizes
from deepserve.persistence.target import parse_target


def test_schema_has_a_column_for_every_record_field() -> None:
    assert check_columns() == []


def _built(steps: list, first_id: int = 100) -> list[list[tuple]]:
    """Rows as a reader selects them: (*fields, crc32, step id), run id dropped,
    booleans as 0/1 (as SQLite returns them)."""
    flat = step_rows(map(astuple, steps), "r", range(first_id, first_id + len(steps)), astuple)
    out = []
    for table, data in zip(STEP_TABLES, flat, strict=True):
        rows = rows_of(data, len(INSERT_COLUMNS[table]))
        assert all(r[1] == "r" for r in rows)
        out.append([ints_for_bools((*r[2:], r[0])) for r in rows])
    return out


def test_rows_round_trip() -> None:
    """The one row builder and the one step assembly are inverses, through both
    ways a reader makes `Step`s (convert in-process, msgpack through a pipe)."""
    _, steps = expected()
    steps = steps + edge_steps()
    ins, evs, outs, snaps = _built(steps)
    assert [r[-1] for r in ins] == list(range(100, 100 + len(steps)))
    groups = group_steps(ins, evs, outs, snaps)
    assert encoded(msgspec.convert(groups, list[Step], strict=False)) == encoded(steps)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(groups), type=list[Step], strict=False)
    assert encoded(back) == encoded(steps)


def test_builder_takes_decoded_lists_as_the_writer_process_does() -> None:
    _, steps = expected()
    lists = msgspec.msgpack.decode(encoded(steps))
    from_structs = step_rows(map(astuple, steps), "r", range(1, len(steps) + 1), astuple)
    assert step_rows(lists, "r", range(1, len(steps) + 1), iter) == from_structs


def test_assembly_skips_children_of_unselected_steps() -> None:
    steps = edge_steps()
    ins, evs, outs, snaps = _built(steps, first_id=1)
    chosen = [r for r in ins if r[-1] != 2]  # step 2 filtered out
    back = msgspec.convert(group_steps(chosen, evs, outs, snaps), list[Step], strict=False)
    assert encoded(back) == encoded([steps[0], steps[2], steps[3]])


def test_rows_of_refuses_a_ragged_list() -> None:
    with pytest.raises(ValueError, match="do not make rows of 3 columns"):
        rows_of([1, 2, 3, 4], 3)


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
    h[18:24] = bytes([2, 2, 0, 64, 32, 32])  # WAL mode; the fixed payload fractions
    h[44:48] = (4).to_bytes(4, "big")  # schema format
    h[56:60] = (1).to_bytes(4, "big")  # UTF-8
    h[24:28] = (5).to_bytes(4, "big")
    h[28:32] = pages.to_bytes(4, "big")
    h[92:96] = (5 if valid else 4).to_bytes(4, "big")
    return bytes(h)


def test_header_problems() -> None:
    assert header_problem(_header(), 40960, False) is None
    assert header_problem(_header(), 40960 - 4096, False) == (
        "truncated: 36864 bytes (9 whole pages), but its header says 10 pages of 4096 bytes "
        "(or its page count, byte 28, is corrupt)"
    )
    assert header_problem(_header(), 40000, False) == (
        "truncated: 40000 bytes, but its header says 10 pages of 4096 bytes"
    )
    corrupt = bytearray(_header())
    corrupt[21] = 65
    assert header_problem(bytes(corrupt), 40960, False) == (
        "corrupt SQLite header: maximum embedded payload fraction (byte 21) is 65, not 64"
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

    from deepserve.persistence import StepFilter, open_sink
    from deepserve.persistence.schema import inputs
    from deepserve.persistence.sql_reader import INPUT_COLS, input_filter

    p = str(tmp_path / "plan.db")
    open_sink(p).close()
    stmt = select(*INPUT_COLS).where(*input_filter("r", StepFilter()))
    sql = str(stmt.order_by(inputs.c.id).compile(dialect=sqlite.dialect()))
    plan = " ".join(r[3] for r in sqlite3.connect(p).execute("EXPLAIN QUERY PLAN " + sql, ("r",)))
    assert plan == "SCAN inputs"
