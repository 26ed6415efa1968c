"""The SQLite writer's hot path: one batch per transaction, straight through stdlib sqlite3.

SQLAlchemy compiles the INSERT statements (it owns the schema); the rows go to the
DBAPI as multi-row `INSERT ... VALUES (...), (...), ...` statements of up to a few
thousand rows. Compared with `executemany` (one sqlite3_step per row) that is ~20 %
faster, and it releases the GIL once per few thousand rows instead of once per row,
so a busy driver thread slows the writer down much less.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Sequence

from sqlalchemy import func, insert, select
from sqlalchemy.dialects import sqlite as sqlite_dialect

from deepserve.core.records import RunRec, Step

from .rows import batch_rows
from .schema import INSERT_COLUMNS, inputs, metadata
from .sqlite_store import BUSY_MS

# async: nothing crashes for real in sim, and a WAL commit without fsync still survives
# a process kill (the pages are in the OS cache). outbox: NORMAL keeps the file
# consistent across power loss too; pass synchronous="full" to also fsync every commit.
SYNCHRONOUS = {"async": "OFF", "outbox": "NORMAL"}

_chain = itertools.chain.from_iterable


def insert_sql() -> dict[str, str]:
    """Single-row INSERT per table, parameters in `INSERT_COLUMNS` order."""
    dialect = sqlite_dialect.dialect()
    sql = {}
    for name, cols in INSERT_COLUMNS.items():
        compiled = insert(metadata.tables[name]).compile(dialect=dialect, column_keys=list(cols))
        assert list(compiled.positiontup or ()) == list(cols), name
        sql[name] = str(compiled)
    return sql


def chunk_sizes(n: int, top: int) -> list[int]:
    """Split n rows into chunks of `top` rows, then powers of two: few distinct
    statement shapes, so sqlite3's statement cache prepares each only once."""
    sizes = [top] * (n // top)
    rest = n % top
    bit = top
    while rest:
        bit >>= 1
        if rest >= bit:
            sizes.append(bit)
            rest -= bit
    return sizes


class MultiInsert:
    """INSERTs of many rows per statement for one table."""

    def __init__(self, one_row_sql: str, ncols: int, max_vars: int) -> None:
        self._head, self._values = one_row_sql.split(" VALUES ", 1)
        top = 1
        while top * 2 * ncols <= max_vars:
            top *= 2
        self.top = top  # rows per full statement, a power of two
        self._sql: dict[int, str] = {}

    def sql(self, rows: int) -> str:
        text = self._sql.get(rows)
        if text is None:
            text = self._sql[rows] = f"{self._head} VALUES {','.join([self._values] * rows)}"
        return text

    def run(self, conn: sqlite3.Connection, rows: list[tuple]) -> None:
        pos = 0
        for size in chunk_sizes(len(rows), self.top):
            conn.execute(self.sql(size), tuple(_chain(rows[pos : pos + size])))
            pos += size


class SqliteBatchStore:
    """Writes one batch per transaction. Lives in (and only touches) the writer thread."""

    def __init__(self, path: str, durability: str, synchronous: str | None = None) -> None:
        self.label = path
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_MS / 1000)
        sync = (synchronous or SYNCHRONOUS[durability]).upper()
        for pragma in (
            f"synchronous={sync}",
            f"busy_timeout={BUSY_MS}",
            "cache_size=-65536",  # 64 MiB: index pages stay hot across batches
        ):
            self.conn.execute(f"PRAGMA {pragma}")
        max_vars = self.conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self.inserts = {
            name: MultiInsert(sql, len(INSERT_COLUMNS[name]), max_vars)
            for name, sql in insert_sql().items()
        }
        self.max_id = str(select(func.max(inputs.c.id)).compile(dialect=sqlite_dialect.dialect()))
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
                    self.inserts[name].run(c, data)
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        self.run_id = rows.run_id
        return rows.steps

    def close(self) -> None:
        self.conn.close()
