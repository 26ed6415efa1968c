"""`SqliteLog`: the `LogReader` over one SQLite file, with a fast path for steps.

Runs, actors and snapshots come through `SqlLog` (SQLAlchemy Core). Steps, the one
hot path (`replay verify` reads every step), use the file's sqlite3 connection
directly: `sql.read_steps` fetches plain tuples and `msgspec.convert` builds a
chunk's `Step`s in one C call. Per step of the replay benchmark's log (one input, one
event, one output): ~3.9 µs to fetch the rows (~0.1 µs a column value), ~0.9 µs to
group them, ~0.5-0.8 µs to convert, against ~7.4 µs through SQLAlchemy rows,
three queries and SQLAlchemy's row objects.

Even so, fetching is as costly as what `verify` does with a step (~6 µs), so a whole
run of a large log (no filters: verify, digests) is read by a child process on the
other core (`process_reader`): this process reads the first `PREFETCH_LEAD` steps itself,
covering the child's start (~40 ms), and the child streams the rest. `deepserve bench
kernel --scale 0.5` (2 cores): `replay_inputs_per_s_sqlite` ~64k -> ~140k inputs/s
(~90k with the in-process path alone), against ~160k verifying an in-memory log.
Filtered reads select few steps and are read in-process. A run in pages (`pages.py`,
written by the writer process) is read in-process too: a page is one msgspec decode.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import ColumnElement, select
from sqlalchemy.dialects import sqlite as sqlite_dialect

from deepserve.core.records import Step

from ..api import StepFilter
from ..rows import DamagedRow
from ..schema import inputs
from ..sql_reader import CHILD_COLS, INPUT_COLS, SqlLog, damaged, input_filter, to_steps
from .files import BUSY_MS, SqliteDb, read_only_uri
from .process_reader import FRAME_BYTES, ReaderProcess, live_readers
from .sql import read_steps


def _spare_cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))  # the ones we may run on (containers, taskset)
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return cores - 1


# Measured with `deepserve bench kernel` on 2 cores; a 10k-step run verifies ~30%
# faster with the process, a 5k one no faster.
CHUNK = 512  # steps per query round in-process: small enough to stay in the CPU caches
PROC_CHUNK = 256  # steps per query round, and per frame, in the reader process
PREFETCH_MIN_STEPS = 10_000  # a shorter run is read in-process: a process would not pay
PREFETCH_LEAD = 4096  # read in-process while the reader process starts
# Reader processes at once (in this process): on one core, none — the child's work
# would only add to ours.
MAX_READERS = _spare_cores()

_DIALECT = sqlite_dialect.dialect()
# `SELECT <fields>, step_id FROM <table>` per child table (see `sql.Children`)
_CHILD_HEADS = [
    str(select(*cols).compile(dialect=_DIALECT)).replace("\n", " ") for cols in CHILD_COLS.values()
]


def input_sql(conds: Sequence[ColumnElement[bool]]) -> tuple[str, list[Any]]:
    """The inputs query for `conds` as SQLite SQL and positional parameters: the
    filters stay defined once (`sql_reader.input_filter`), for both backends."""
    compiled = select(*INPUT_COLS).where(*conds).order_by(inputs.c.id).compile(dialect=_DIALECT)
    return str(compiled), [compiled.params[name] for name in compiled.positiontup or ()]


class SqliteLog(SqlLog):
    """`LogReader` over one SQLite file. See the module docstring."""

    db: SqliteDb

    def __init__(self, db: SqliteDb) -> None:
        super().__init__(db)
        self._readers: weakref.WeakSet[ReaderProcess] = weakref.WeakSet()

    def read_steps(self, run_id: str | None, where: StepFilter) -> Iterator[Step]:
        run = self.resolve_run(run_id)
        if run is None:
            return
        if self.is_paged(run):  # one decode a page: no reader process needed
            yield from self.paged_steps(run, where)
            return
        span = self._prefetch_span(run) if where.whole_run else None
        conds = input_filter(run, where)
        reader = None if span is None else self._start_reader(conds, span[1])
        if span is None or reader is None:
            yield from self._local(conds)
            return
        try:
            yield from self._local([*conds, inputs.c.id.between(span[0], span[1])])
            yield from reader.steps()
        finally:
            reader.stop()

    def _local(self, conds: Sequence[ColumnElement[bool]]) -> Iterator[Step]:
        """Steps read and built in this process."""
        db = self.db
        sql, params = input_sql(conds)
        with db.errors():
            groups = read_steps(db.raw, sql, params, _CHILD_HEADS, CHUNK)
        try:
            while True:
                try:
                    with db.errors():
                        chunk = next(groups, None)
                except DamagedRow as exc:
                    raise damaged(self.label, exc) from None
                if chunk is None:
                    return
                yield from to_steps(self.label, chunk)
        finally:
            groups.close()

    def _prefetch_span(self, run: str) -> tuple[int, int] | None:
        """(first step id of the run, last id to read in-process) when the rest of the
        run is worth a reader process; None to read it all in-process."""
        if live_readers() >= MAX_READERS or os.name != "posix":  # pipes passed by fd number
            return None
        with self.db.errors():
            conn = self.db.raw
            # a rowid scan (+run_id: not the index): instant unless earlier runs are long
            first = conn.execute(
                "SELECT id FROM inputs WHERE +run_id = ? ORDER BY id LIMIT 1", (run,)
            ).fetchone()
            (last,) = conn.execute("SELECT max(id) FROM inputs").fetchone()
        if first is None or last - first[0] < PREFETCH_MIN_STEPS:
            return None
        return first[0], first[0] + PREFETCH_LEAD - 1

    def _start_reader(
        self, conds: Sequence[ColumnElement[bool]], split: int
    ) -> ReaderProcess | None:
        """A reader process for the run's steps after `split`; None if none starts."""
        sql, params = input_sql([*conds, inputs.c.id > split])
        cfg = {
            "uri": read_only_uri(self.db.path),
            "timeout": BUSY_MS / 1000,
            "sql": sql,
            "params": params,
            "kids": _CHILD_HEADS,
            "size": PROC_CHUNK,
            "frame_bytes": FRAME_BYTES,
        }
        try:
            reader = ReaderProcess(self.label, cfg)
        except OSError:
            return None  # no process to be had (limits): read in-process, just slower
        self._readers.add(reader)
        return reader

    def check_integrity(self) -> None:
        self.db.check_integrity()  # the file's structures and indexes, then what pages hold
        self.check_pages()
        self.check_ends()  # then that the runs hold what their writers closed them with

    def close(self) -> None:
        for reader in list(self._readers):
            reader.stop()
        super().close()
