"""What the thread writer's two SQLite layouts share (`batch_store.SqliteBatchStore`, rows;
`page_store.SqlitePageStore`, pages): the connection and its pragmas, one transaction a batch,
the runs it begins, step ids drawn under the write lock, each run's closing-record sums.
A layout says only how a run's record and a part's steps are stored (`_insert_run`,
`_insert_steps`) and how its closing records are written (`end_runs`). No SQLAlchemy here."""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from msgspec.structs import astuple

from deepserve.core.records import RunRec, Step

from ..errors import RunExists
from ..group_commit import runs_and_steps
from ..pages import part_steps
from ..rows import RunningDigest, run_row
from .checks import BUSY_MS
from .fresh import max_id_sql, writer_pragmas
from .sql import RUN_EXISTS, transaction


class SqliteThreadStore(ABC):
    """Writes one batch per transaction. Lives in (and only touches) the writer thread."""

    def __init__(self, path: str, durability: str, synchronous: str | None = None,
                 cache_kib: int | None = None) -> None:  # fmt: skip
        self.label = path
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_MS / 1000)
        for pragma in writer_pragmas(durability, synchronous, cache_kib):
            self.conn.execute(f"PRAGMA {pragma}")
        self.max_vars = self.conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self.max_id = max_id_sql()
        self.run_id: str | None = None
        self.process = ""
        # each run's closing-record sums, by (run id, process): written by `end_runs`
        self.ends: dict[tuple[str, str], RunningDigest] = {}

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
                self._insert_run(c, run_row(astuple(part)))
                run_id, process = part.run_id, part.process
                self.ends[(run_id, process)] = RunningDigest()
                continue
            if run_id is None:
                raise ValueError("a step was appended before begin_run()")
            # a failed transaction fails the sink, which then writes no closing record at all
            self._insert_steps(c, run_id, next_id, part, self.ends[(run_id, process)])
            next_id += part_steps(part)  # (an `EncodedSteps` holds several)
        return next_id - first_id, (run_id, process)  # the run switches once committed

    @abstractmethod
    def _insert_run(self, c: sqlite3.Connection, row: list[Any]) -> None:
        """Store the run's row (each layout has its own runs table)."""

    @abstractmethod
    def _insert_steps(self, c: sqlite3.Connection, run_id: str, first: int, part: list[Step],
                      sums: RunningDigest) -> None:  # fmt: skip
        """Store `part`'s steps as ids `first`, `first + 1`, ... and add them to `sums`."""

    @abstractmethod
    def end_runs(self) -> None:
        """Write each open run's closing record (schema v7)."""

    def close(self) -> None:
        self.conn.close()
