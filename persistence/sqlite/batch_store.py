"""The SQLite writer's statements and the thread writer's `BatchStore`: one batch
per transaction, straight through stdlib sqlite3 (multi-row INSERTs, `sql.py`).

SQLAlchemy compiles the statements here (it owns the schema); the writer process
gets them compiled (`fresh.process_writer_config`), so it never imports SQLAlchemy.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from msgspec.structs import astuple
from sqlalchemy import insert
from sqlalchemy.dialects import sqlite as sqlite_dialect

from deepserve.core.records import Step

from ..rows import STEP_TABLES, RunningDigest, step_rows
from ..schema import INSERT_COLUMNS, metadata
from .sql import MultiInsert, transaction
from .thread_store import SqliteThreadStore


def insert_sql() -> dict[str, str]:
    """Single-row INSERT per table, parameters in `INSERT_COLUMNS` order."""
    dialect = sqlite_dialect.dialect()
    sql = {}
    for name, cols in INSERT_COLUMNS.items():
        compiled = insert(metadata.tables[name]).compile(dialect=dialect, column_keys=list(cols))
        if list(compiled.positiontup or ()) != list(cols):
            raise RuntimeError(f"{name}: compiled INSERT columns differ from INSERT_COLUMNS")
        sql[name] = str(compiled)
    return sql


class SqliteBatchStore(SqliteThreadStore):
    """The row layout: each step's input, events and outputs as rows (multi-row INSERTs)."""

    def __init__(self, path: str, durability: str, synchronous: str | None = None,
                 cache_kib: int | None = None) -> None:  # fmt: skip
        super().__init__(path, durability, synchronous, cache_kib)
        self.inserts = {
            name: MultiInsert(sql, len(INSERT_COLUMNS[name]), self.max_vars)
            for name, sql in insert_sql().items()
        }
        self._input_cols = len(INSERT_COLUMNS["inputs"])

    def _insert_run(self, c: sqlite3.Connection, row: list[Any]) -> None:
        self.inserts["runs"].run_flat(c, row)

    def _insert_steps(self, c: sqlite3.Connection, run_id: str, first: int, part: list[Step],
                      sums: RunningDigest) -> None:  # fmt: skip
        rows = step_rows(map(astuple, part), run_id, range(first, first + len(part)), astuple)
        for name, params in zip(STEP_TABLES, rows, strict=True):
            if params:
                self.inserts[name].run_flat(c, params)
        # the input rows' checksums (each row's last value)
        sums.add(rows.inputs[self._input_cols - 1 :: self._input_cols], len(part))

    def end_runs(self) -> None:
        """The closing record of every run this store wrote, in one transaction: called once
        everything appended is committed and the sink closes cleanly (`GroupCommitSink`)."""
        rows = [v for (run_id, process), d in self.ends.items() for v in d.end_row(run_id, process)]
        if rows:
            transaction(self.conn, lambda c: self.inserts["run_ends"].run_flat(c, rows))
