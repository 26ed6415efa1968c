"""The SQLite writer's hot path: one batch per transaction, straight through stdlib sqlite3.

SQLAlchemy compiles the INSERT statements (it owns the schema); the rows go to the
DBAPI as multi-row `INSERT ... VALUES (...), (...), ...` statements of up to a few
thousand rows. Compared with `executemany` (one sqlite3_step per row) that is ~20 %
faster, and it releases the GIL once per few thousand rows instead of once per row,
so a busy driver thread slows the writer down much less.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.dialects import sqlite as sqlite_dialect

from deepserve.core.records import RunRec, Step

from .logproc import MultiInsert, chunk_sizes  # noqa: F401 — chunk_sizes: re-exported
from .rows import batch_rows
from .schema import INSERT_COLUMNS, RUN_FIELDS, inputs, metadata
from .sqlite_store import BUSY_MS

# async: nothing crashes for real in sim, and a WAL commit without fsync still survives
# a process kill (the pages are in the OS cache). outbox: NORMAL keeps the file
# consistent across power loss too; pass synchronous="full" to also fsync every commit.
SYNCHRONOUS = {"async": "OFF", "outbox": "NORMAL"}


def insert_sql() -> dict[str, str]:
    """Single-row INSERT per table, parameters in `INSERT_COLUMNS` order."""
    dialect = sqlite_dialect.dialect()
    sql = {}
    for name, cols in INSERT_COLUMNS.items():
        compiled = insert(metadata.tables[name]).compile(dialect=dialect, column_keys=list(cols))
        assert list(compiled.positiontup or ()) == list(cols), name
        sql[name] = str(compiled)
    return sql


def writer_pragmas(durability: str, synchronous: str | None = None) -> list[str]:
    """The writer connection's settings (thread and process writers alike)."""
    sync = (synchronous or SYNCHRONOUS[durability]).upper()
    return [
        f"synchronous={sync}",
        f"busy_timeout={BUSY_MS}",
        "cache_size=-65536",  # 64 MiB: index pages stay hot across batches
    ]


def max_id_sql() -> str:
    return str(select(func.max(inputs.c.id)).compile(dialect=sqlite_dialect.dialect()))


_chain = itertools.chain.from_iterable

# The writer process (`logproc.flat_rows`) unpacks each decoded step as
# [input, events, outputs, snapshot] and fills these tables in this order.
STEP_TABLES = ("inputs", "events", "outputs", "snapshots")
assert Step.__struct_fields__ == ("input", "events", "outputs", "snapshot"), Step.__struct_fields__


def process_writer_config(path: str, synchronous: str | None) -> dict[str, Any]:
    """What the writer process needs, compiled here: it does not import SQLAlchemy."""
    sql = insert_sql()
    return {
        "path": os.path.abspath(path),
        "label": path,
        "timeout": BUSY_MS / 1000,
        "pragmas": writer_pragmas("async", synchronous),
        "runs_sql": sql["runs"],
        "runs_cols": len(INSERT_COLUMNS["runs"]),
        "step_tables": [[sql[t], len(INSERT_COLUMNS[t])] for t in STEP_TABLES],
        "max_id_sql": max_id_sql(),
        "run_id_index": RUN_FIELDS.index("run_id"),
    }


class SqliteBatchStore:
    """Writes one batch per transaction. Lives in (and only touches) the writer thread."""

    def __init__(self, path: str, durability: str, synchronous: str | None = None) -> None:
        self.label = path
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_MS / 1000)
        for pragma in writer_pragmas(durability, synchronous):
            self.conn.execute(f"PRAGMA {pragma}")
        max_vars = self.conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self.inserts = {
            name: MultiInsert(sql, len(INSERT_COLUMNS[name]), max_vars)
            for name, sql in insert_sql().items()
        }
        self.max_id = max_id_sql()
        self.run_id: str | None = None

    def write(self, items: Sequence[Step | RunRec]) -> int:
        """Commit `items` in one transaction; returns the number of steps written."""
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            # Step ids are assigned here, under the write lock, so even a second writer
            # process on the same file (a misconfiguration) cannot collide with ours.
            base = c.execute(self.max_id).fetchone()[0] or 0
            rows = batch_rows(items, self.run_id, itertools.count(base + 1))
            for name, data in zip(INSERT_COLUMNS, rows[:5], strict=True):
                if data:
                    self.inserts[name].run_flat(c, list(_chain(data)))
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        self.run_id = rows.run_id
        return rows.steps

    def close(self) -> None:
        self.conn.close()
