"""`SqlLog`: the `LogReader` over one SQL database (an SQLite file or PostgreSQL).

A run is stored in rows (below) or, written by the writer process, in pages
(`pages.py`): every method asks `is_paged` first.

Steps stream: input rows come from one cursor `CHUNK` at a time, and for each chunk
the events, outputs and snapshots of exactly those steps are fetched by step id,
grouped into step tuples (`rows.group_steps`) and converted to `Step`s in one
msgspec call (`to_steps`). Memory stays bounded by the chunk size whatever the
log's length. An SQLite file's steps take a faster path through plain sqlite3
(`sqlite.log_reader.SqliteLog`); this one serves PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import msgspec
from sqlalchemy import Row, Select, Table, func, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement, Executable
from sqlalchemy.sql.visitors import InternalTraversal

from deepserve.core.records import RunRec, SnapshotRec, Step

from .api import EndState, LogReader, StepFilter
from .errors import LogError
from .pages import Page, PageHead, check_page_head, page_actors, page_snapshots, page_steps
from .rows import DamagedRow, check_rows, group_steps, id_range_is_dense, ints_for_bools, row_crc
from .run_ends import check_ends, end_state
from .schema import (
    EVENT_FIELDS,
    INPUT_FIELDS,
    OUTPUT_FIELDS,
    RUN_FIELDS,
    SNAPSHOT_FIELDS,
    events,
    inputs,
    outputs,
    pages,
    runs,
    snapshots,
)

CHUNK = 1000
PAGE_CHUNK = 8  # pages fetched at a time: ~1 MB of a simulation's steps


class Db(Protocol):
    """What `SqlLog` needs from a backend; errors come out as one-line `LogError`s."""

    label: str

    def all(self, stmt: Executable) -> Sequence[Row]: ...

    def chunks(self, stmt: Executable, size: int) -> Iterator[Sequence[Row]]: ...

    def close(self) -> None: ...


# Every row read for a step ends with its checksum and its step id (see `rows.group_steps`).
RUN_COLS = [*(runs.c[f] for f in RUN_FIELDS), runs.c.crc32]
INPUT_COLS = [*(inputs.c[f] for f in INPUT_FIELDS), inputs.c.crc32, inputs.c.id]
CHILD_COLS = {
    t.name: [*(t.c[f] for f in fields), t.c.crc32, t.c.step_id]
    for t, fields in (
        (events, EVENT_FIELDS),
        (outputs, OUTPUT_FIELDS),
        (snapshots, SNAPSHOT_FIELDS),
    )
}


def record_error(label: str, exc: Exception) -> LogError:
    """A row that does not make a record (SQLite keeps whatever a column is given:
    text in an integer column of a damaged or foreign file)."""
    return LogError(f"{label}: a step's rows do not fit the log's record types ({exc})")


def damaged(label: str, exc: DamagedRow) -> LogError:
    return LogError(f"{label}: {exc}")


def to_steps(label: str, groups: list[tuple]) -> list[Step]:
    """Step tuples (`rows.group_steps`) as `Step`s, in one C call."""
    try:
        return msgspec.convert(groups, list[Step], strict=False)
    except msgspec.ValidationError as exc:
        raise record_error(label, exc) from None


class _Unindexed(ColumnElement[Any]):
    """A column SQLite must read by scanning, not look up through an index (`+col`).

    Reading a whole run is `run_id = ? ORDER BY id`; without ANALYZE statistics the
    SQLite planner takes the run_id index and then sorts the entire run in a temp
    b-tree before the first row comes out. A rowid scan streams in order at once.
    PostgreSQL has statistics and gets the plain column."""

    inherit_cache = True
    _traverse_internals = [("col", InternalTraversal.dp_clauseelement)]

    def __init__(self, col: ColumnElement[Any]) -> None:
        self.col = col
        self.type = col.type


@compiles(_Unindexed)
def _unindexed_default(element: _Unindexed, compiler: Any, **kw: Any) -> str:
    return compiler.process(element.col, **kw)


@compiles(_Unindexed, "sqlite")
def _unindexed_sqlite(element: _Unindexed, compiler: Any, **kw: Any) -> str:
    return "+" + compiler.process(element.col, **kw)


def input_filter(run_id: str, where: StepFilter) -> list[ColumnElement[bool]]:
    """`where` as SQL conditions on the inputs table (both backends)."""
    if where.whole_run:
        return [_Unindexed(inputs.c.run_id) == run_id]
    conds = [inputs.c.run_id == run_id]
    if where.actor is not None:
        conds.append(inputs.c.actor == where.actor)
    if where.corr is not None:
        conds.append(inputs.c.corr == where.corr)
    if where.since is not None:
        conds.append(inputs.c.t >= where.since)
    if where.until is not None:
        conds.append(inputs.c.t <= where.until)
    return conds


def children_query(table: Table, ids: Sequence[int]) -> Select:
    step_id = table.c.step_id
    cond = step_id.between(ids[0], ids[-1]) if id_range_is_dense(ids) else step_id.in_(ids)
    return select(*CHILD_COLS[table.name]).where(cond).order_by(step_id, table.c.id)


class SqlLog(LogReader):
    """`LogReader` over one database. `run_id=None` means the last run begun."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.label = db.label

    def runs(self) -> list[RunRec]:
        rows = self.db.all(select(*RUN_COLS).order_by(runs.c.id))
        for r in rows:
            if row_crc(tuple(r[:-1])) != r[-1]:
                raise LogError(f"{self.label}: damaged log: the runs row of run {r[0]!r} does "
                               "not match its checksum (its record cannot be trusted)")  # fmt: skip
        return [RunRec(*r[:-1]) for r in rows]  # type: ignore[arg-type]

    def has_run(self, run_id: str) -> bool:
        return bool(self.db.all(select(runs.c.id).where(runs.c.run_id == run_id).limit(1)))

    def resolve_run(self, run_id: str | None) -> str | None:
        """The run to read; None for an empty log; `LogError` for an unknown run."""
        if run_id is None:
            last = self.db.all(select(runs.c.run_id).order_by(runs.c.id.desc()).limit(1))
            return last[0][0] if last else None
        if not self.has_run(run_id):
            raise LogError(f"{self.label}: no run {run_id!r} in this log")
        return run_id

    def actors(self, run_id: str | None = None) -> list[str]:
        run = self.resolve_run(run_id)
        if run is None:
            return []
        if self.is_paged(run):
            return sorted(page_actors(self.label, run, self.page_bodies(run)))
        stmt = select(inputs.c.actor).where(inputs.c.run_id == run, inputs.c.seq >= 0).distinct()
        return sorted(r[0] for r in self.db.all(stmt))  # Python order: collation-independent

    def run_end(self, run_id: str | None = None) -> EndState:
        run = self.resolve_run(run_id)
        return EndState(None) if run is None else end_state(self.db, run)

    def check_ends(self) -> None:
        """Every run's closing records against the steps the log holds (`run_ends.py`)."""
        for run_id in dict.fromkeys(r.run_id for r in self.runs()):
            check_ends(self.db, run_id, self.is_paged(run_id))

    def check_integrity(self) -> None:
        self.check_ends()  # PostgreSQL keeps its own pages whole; what they hold is checked here

    # ---- the paged layout (`pages.py`): a run written by the writer process -----------
    def is_paged(self, run: str) -> bool:
        """Whether `run`'s steps are in pages (it has no rows then)."""
        return bool(self.db.all(select(pages.c.id).where(pages.c.run_id == run).limit(1)))

    def page_bodies(self, run: str, where: StepFilter | None = None) -> Iterator[Page]:
        """`run`'s pages in log order, as (id, body, crc32); with a time range, only
        the pages that hold an input inside it (by their `t_first`/`t_last`)."""
        stmt = select(pages.c.id, pages.c.body, pages.c.crc32).where(pages.c.run_id == run)
        if where is not None and where.since is not None:
            stmt = stmt.where(pages.c.t_last >= where.since)
        if where is not None and where.until is not None:
            stmt = stmt.where(pages.c.t_first <= where.until)
        for chunk in self.db.chunks(stmt.order_by(pages.c.id), PAGE_CHUNK):
            for row in chunk:
                yield row[0], row[1], row[2]

    def check_pages(self) -> None:
        """Every page of every run against its checksum (`LogError` at the first that
        fails), then that no step is missing: part of `check_integrity` for a SQLite file."""
        c = pages.c
        stmt = select(c.run_id, c.id, c.body, c.crc32, c.steps, c.t_first, c.t_last, c.first_step)
        ends: dict[str, int] = {}  # where each run's previous page ended
        paged = 0
        for chunk in self.db.chunks(stmt.order_by(c.id), PAGE_CHUNK):
            for run, page_id, body, crc, steps, t_first, t_last, first in chunk:
                head = PageHead(steps, t_first, t_last)
                ends[run] = check_page_head(self.label, run, (page_id, body, crc), head, first,
                                            ends.get(run))  # fmt: skip
                paged += steps
        self._check_no_step_missing(paged, max(ends.values(), default=1) - 1)

    def _check_no_step_missing(self, paged: int, last_paged: int) -> None:
        """Step ids run 1..N without a gap in a SQLite log (rows and pages draw them from one
        sequence, under the write lock): a deleted input row or page leaves one, which no
        checksum sees (the rows and pages left are intact) and which readers other than
        verify would skip silently (a tour: `replay why` left a hop out)."""
        rows, last_row = self.db.all(select(func.count(), func.coalesce(func.max(inputs.c.id), 0)))[0]
        last = max(last_row, last_paged)
        if rows + paged != last:
            raise LogError(f"{self.label}: damaged log: it holds {rows + paged:,} steps but its step ids "
                           f"run 1..{last:,}: {last - rows - paged:,} are missing or repeated (a deleted "
                           "row or page; its records cannot be trusted)")  # fmt: skip

    def paged_steps(self, run: str, where: StepFilter) -> Iterator[Step]:
        """The steps of a paged run that `where` selects (`pages.page_steps`)."""
        return page_steps(self.label, run, self.page_bodies(run, where), where)

    def read_steps(self, run_id: str | None, where: StepFilter) -> Iterator[Step]:
        run = self.resolve_run(run_id)
        if run is None:
            return
        if self.is_paged(run):
            yield from self.paged_steps(run, where)
            return
        stmt = select(*INPUT_COLS).where(*input_filter(run, where)).order_by(inputs.c.id)
        for chunk in self.db.chunks(stmt, CHUNK):
            ids = [r[-1] for r in chunk]
            kids = [self.db.all(children_query(t, ids)) for t in (events, outputs, snapshots)]
            try:
                groups = group_steps(_tuples(chunk), *map(_tuples, kids))
            except DamagedRow as exc:
                raise damaged(self.label, exc) from None
            yield from to_steps(self.label, groups)

    def snapshots(
        self, run_id: str | None = None, actor: str | None = None
    ) -> Iterator[SnapshotRec]:
        run = self.resolve_run(run_id)
        if run is None:
            return
        if self.is_paged(run):
            yield from page_snapshots(self.label, run, self.page_bodies(run), actor)
            return
        stmt = select(*CHILD_COLS["snapshots"]).where(snapshots.c.run_id == run)
        if actor is not None:
            stmt = stmt.where(snapshots.c.actor == actor)
        for chunk in self.db.chunks(stmt.order_by(snapshots.c.id), CHUNK):
            rows = _tuples(chunk)
            try:
                check_rows("snapshots", rows)
            except DamagedRow as exc:
                raise damaged(self.label, exc) from None
            yield from msgspec.convert(rows, list[SnapshotRec], strict=False)

    def close(self) -> None:
        self.db.close()


def _tuples(rows: Sequence[Row]) -> list[tuple]:
    # booleans as 0/1, as their checksums were summed (PostgreSQL returns bools)
    return [ints_for_bools(r) for r in rows]
