"""`SqliteLog`: the `LogReader` over one SQLite file, with a fast path for steps.

Runs, actors and snapshots come through `SqlLog` (SQLAlchemy Core). Steps, the one
hot path (`replay verify` reads every step), use the file's sqlite3 connection
directly: `readproc.read_groups` fetches plain tuples and `msgspec.convert` builds a
chunk's `Step`s in one C call. Per step of the replay benchmark's log (one input, one
event, one output): ~3.9 µs to fetch the rows (~0.1 µs a column value), ~0.9 µs to
group them, ~0.5-0.8 µs to convert, against ~7.4 µs through SQLAlchemy rows,
three queries and `rows.join_steps`.

Even so, fetching is as costly as what `verify` does with a step (~6 µs), so a whole
run of a large log (no filters: verify, digests) is read by a child process on the
other core (`procread`): this process reads the first `PREFETCH_LEAD` steps itself,
covering the child's start (~40 ms), and the child streams the rest. `deepserve bench
kernel --scale 0.5` (2 cores): `replay_inputs_per_s_sqlite` ~64k -> ~140k inputs/s
(~90k with the in-process path alone), against ~160k verifying an in-memory log.
Filtered reads select few steps and are read in-process.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
from sqlalchemy import ColumnElement, select
from sqlalchemy.dialects import sqlite as sqlite_dialect

from deepserve.core.records import Step

from .procread import ReaderProcess, live_readers, record_error
from .reader import SqlLog, input_filter
from .readproc import FRAME_BYTES, read_groups
from .schema import EVENT_FIELDS, INPUT_FIELDS, OUTPUT_FIELDS, SNAPSHOT_FIELDS, inputs
from .sqlite_store import BUSY_MS, SqliteDb


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

# Input rows end with the step id, child rows with their step id (see `readproc`).
_INPUT_COLS = [*(inputs.c[f] for f in INPUT_FIELDS), inputs.c.id]
_CHILD_HEADS = [
    f"SELECT {', '.join(fields)}, step_id FROM {table}"
    for table, fields in (
        ("events", EVENT_FIELDS),
        ("outputs", OUTPUT_FIELDS),
        ("snapshots", SNAPSHOT_FIELDS),
    )
]
_DIALECT = sqlite_dialect.dialect()


def input_sql(where: Sequence[ColumnElement[bool]]) -> tuple[str, list[Any]]:
    """The inputs query for `where` as SQLite SQL and positional parameters: the
    filters stay defined once (`reader.input_filter`), for both backends."""
    compiled = select(*_INPUT_COLS).where(*where).order_by(inputs.c.id).compile(dialect=_DIALECT)
    return str(compiled), [compiled.params[name] for name in compiled.positiontup or ()]


class SqliteLog(SqlLog):
    """`LogReader` over one SQLite file. See the module docstring."""

    db: SqliteDb

    def __init__(self, db: SqliteDb) -> None:
        super().__init__(db)
        self._readers: weakref.WeakSet[ReaderProcess] = weakref.WeakSet()

    def steps(
        self,
        run_id: str | None = None,
        *,
        actor: str | None = None,
        corr: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> Iterator[Step]:
        run = self.resolve_run(run_id)
        if run is None:
            return
        where = input_filter(run, actor, corr, since, until)
        whole_run = actor is None and corr is None and since is None and until is None
        span = self._prefetch_span(run) if whole_run else None
        reader = None if span is None else self._start_reader(where, span[1])
        if reader is None:
            yield from self._local(where)
            return
        try:
            yield from self._local([*where, inputs.c.id.between(*span)])
            yield from reader.steps()
        finally:
            reader.stop()

    def _local(self, where: Sequence[ColumnElement[bool]]) -> Iterator[Step]:
        """Steps read and built in this process."""
        db = self.db
        sql, params = input_sql(where)
        with db.errors():
            groups = read_groups(db.raw, sql, params, _CHILD_HEADS, CHUNK)
        try:
            while True:
                with db.errors():
                    chunk = next(groups, None)
                if chunk is None:
                    return
                try:
                    steps = msgspec.convert(chunk, list[Step], strict=False)
                except msgspec.ValidationError as exc:
                    raise record_error(self.label, exc) from None
                yield from steps
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
        self, where: Sequence[ColumnElement[bool]], split: int
    ) -> ReaderProcess | None:
        """A reader process for the run's steps after `split`; None if none starts."""
        sql, params = input_sql([*where, inputs.c.id > split])
        cfg = {
            "path": os.fsencode(self.db.path),
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

    def close(self) -> None:
        for reader in list(self._readers):
            reader.stop()
        super().close()
