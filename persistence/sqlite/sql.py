"""SQLite statements on plain sqlite3, shared by this process and the child processes
(standard library only): multi-row INSERTs for writing, the step query for reading.

Writing: rows go to SQLite as `INSERT ... VALUES (...), (...), ...` statements of up
to a few thousand rows. Against `executemany` (one sqlite3_step per row) that is ~20 %
faster, and it releases the GIL once per few thousand rows instead of once per row,
so a busy driver thread slows a writer thread down much less.

Reading: `read_steps` is the one reading loop (in-process and in the reader
process): input rows `size` at a time from one cursor, then the events, outputs and
snapshots of exactly those steps, one query per table and chunk, grouped into step
tuples by `rows.group_steps`.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Generator, Sequence
from typing import Any

from ..rows import Row, group_steps, id_range_is_dense

RUN_EXISTS = "SELECT 1 FROM runs WHERE run_id = ? AND process = ? LIMIT 1"
MAX_IN = 512  # ids in one IN (...): within SQLite's historical 999-variable limit


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
        self.ncols = ncols
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

    def run_flat(self, conn: sqlite3.Connection, params: list[Any]) -> None:
        """`params`: the rows' values one after another (`ncols` per row)."""
        n = self.ncols
        rows = len(params) // n
        if rows * n != len(params):  # a record of another shape would shift every column
            raise ValueError(f"{len(params)} values do not make rows of {n} columns")
        pos = 0
        for size in chunk_sizes(rows, self.top):
            part = params if size == rows else params[pos * n : (pos + size) * n]
            conn.execute(self.sql(size), part)
            pos += size


def transaction(conn: sqlite3.Connection, body: Any) -> Any:
    """`body(conn)` in one write transaction (the write lock taken up front)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        out = body(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return out


class Children:
    """The queries for one child table: `head` is `SELECT <fields>, step_id FROM t`."""

    def __init__(self, head: str) -> None:
        self.dense = f"{head} WHERE step_id BETWEEN ? AND ? ORDER BY step_id, id"
        self._head = head
        self._in: dict[int, str] = {}

    def fetch(self, conn: sqlite3.Connection, ids: list[int]) -> list[Row]:
        """Rows of the steps `ids` (ascending): one index range scan when they are most
        of their range, else IN lists padded to a power of two (few distinct
        statements, so sqlite3's statement cache prepares each once)."""
        if id_range_is_dense(ids):
            return conn.execute(self.dense, (ids[0], ids[-1])).fetchall()
        rows: list[Row] = []
        for i in range(0, len(ids), MAX_IN):
            part = ids[i : i + MAX_IN]
            n = 1 << (len(part) - 1).bit_length()
            part += [part[-1]] * (n - len(part))
            rows += conn.execute(self._in_sql(n), part).fetchall()
        return rows

    def _in_sql(self, n: int) -> str:
        sql = self._in.get(n)
        if sql is None:
            marks = ",".join("?" * n)
            sql = self._in[n] = f"{self._head} WHERE step_id IN ({marks}) ORDER BY step_id, id"
        return sql


def read_steps(
    conn: sqlite3.Connection, sql: str, params: Sequence[Any], heads: Sequence[str], size: int
) -> Generator[list[tuple], None, None]:
    """Step tuples of the input query `sql` (its rows end with the step id, in id
    order), `size` steps at a time. The open cursor keeps one read transaction, so
    the child queries see the same snapshot as the inputs."""
    kids = [Children(h) for h in heads]
    cur = conn.execute(sql, params)
    try:
        while ins := cur.fetchmany(size):
            ids = [r[-1] for r in ins]
            yield group_steps(ins, *(k.fetch(conn, ids) for k in kids))
    finally:
        with contextlib.suppress(sqlite3.ProgrammingError):  # the log was closed first
            cur.close()
