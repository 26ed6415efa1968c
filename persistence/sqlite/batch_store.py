"""The SQLite writer's statements and the thread writer's `BatchStore`: one batch
per transaction, straight through stdlib sqlite3 (multi-row INSERTs, `sql.py`).

SQLAlchemy compiles the statements here (it owns the schema); the writer process
gets them compiled (`fresh.process_writer_config`), so it never imports SQLAlchemy.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from msgspec.structs import astuple
from sqlalchemy import insert
from sqlalchemy.dialects import sqlite as sqlite_dialect

from deepserve.core.records import RunRec, Step

from ..errors import RunExists
from ..group_commit import runs_and_steps
from ..rows import STEP_TABLES, RunningDigest, run_row, step_rows
from ..schema import INSERT_COLUMNS, metadata
from .checks import BUSY_MS
from .fresh import max_id_sql, writer_pragmas
from .sql import RUN_EXISTS, MultiInsert, transaction


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


class SqliteBatchStore:
    """Writes one batch per transaction. Lives in (and only touches) the writer thread."""

    def __init__(self, path: str, durability: str, synchronous: str | None = None,
                 cache_kib: int | None = None) -> None:  # fmt: skip
        self.label = path
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_MS / 1000)
        for pragma in writer_pragmas(durability, synchronous, cache_kib):
            self.conn.execute(f"PRAGMA {pragma}")
        max_vars = self.conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self.inserts = {
            name: MultiInsert(sql, len(INSERT_COLUMNS[name]), max_vars)
            for name, sql in insert_sql().items()
        }
        self.max_id = max_id_sql()
        self.run_id: str | None = None
        self.process = ""
        # each run's closing-record sums, by (run id, process): written by `end_runs`
        self.ends: dict[tuple[str, str], RunningDigest] = {}
        self._input_cols = len(INSERT_COLUMNS["inputs"])

    def write(self, items: Sequence[Step | RunRec]) -> int:
        """Commit `items` in one transaction; returns the number of steps written."""
        steps, (self.run_id, self.process) = transaction(self.conn, lambda c: self._write(c, items))
        return steps

    def _write(
        self, c: sqlite3.Connection, items: Sequence[Step | RunRec]
    ) -> tuple[int, tuple[str | None, str]]:
        # Step ids are assigned here, under the write lock, so even a second writer
        # process on the same file (a misconfiguration) cannot collide with ours.
        next_id = first_id = (c.execute(self.max_id).fetchone()[0] or 0) + 1
        run_id, process = self.run_id, self.process
        for part in runs_and_steps(items):
            if isinstance(part, RunRec):
                if c.execute(RUN_EXISTS, (part.run_id, part.process)).fetchone() is not None:
                    raise RunExists(self.label, part.run_id, part.process)
                self.inserts["runs"].run_flat(c, run_row(astuple(part)))
                run_id, process = part.run_id, part.process
                self.ends[(run_id, process)] = RunningDigest()
                continue
            if run_id is None:
                raise ValueError("a step was appended before begin_run()")
            rows = step_rows(map(astuple, part), run_id, range(next_id, next_id + len(part)), astuple)
            for name, params in zip(STEP_TABLES, rows, strict=True):
                if params:
                    self.inserts[name].run_flat(c, params)
            # the input rows' checksums (each row's last value): a failed transaction fails
            # the sink, which then writes no closing record at all
            self.ends[(run_id, process)].add(rows.inputs[self._input_cols - 1 :: self._input_cols], len(part))
            next_id += len(part)
        return next_id - first_id, (run_id, process)  # the run switches once committed

    def end_runs(self) -> None:
        """The closing record of every run this store wrote, in one transaction: called once
        everything appended is committed and the sink closes cleanly (`GroupCommitSink`)."""
        rows = [v for (run_id, process), d in self.ends.items() for v in d.end_row(run_id, process)]
        if rows:
            transaction(self.conn, lambda c: self.inserts["run_ends"].run_flat(c, rows))

    def close(self) -> None:
        self.conn.close()
