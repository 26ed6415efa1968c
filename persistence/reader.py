"""`SqlLog`: the `LogReader` over one SQL database (an SQLite file or PostgreSQL).

Steps stream: input rows come from one cursor `CHUNK` at a time, and for each chunk
the events, outputs and snapshots of exactly those steps are fetched by step id and
joined in Python (`rows.join_steps`). Memory stays bounded by the chunk size
whatever the log's length. An SQLite file's steps take a faster path
(`sqlite_reader.SqliteLog`); this one serves PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from sqlalchemy import Row, Select, Table, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ColumnElement, Executable
from sqlalchemy.sql.visitors import InternalTraversal

from deepserve.core.records import RunRec, SnapshotRec, Step

from .api import LogError
from .rows import id_range_is_dense, join_steps, run_from_row, snapshot_from_row
from .schema import (
    EVENT_FIELDS,
    INPUT_FIELDS,
    OUTPUT_FIELDS,
    RUN_FIELDS,
    SNAPSHOT_FIELDS,
    events,
    inputs,
    outputs,
    runs,
    snapshots,
)

CHUNK = 1000


class Db(Protocol):
    """What `SqlLog` needs from a backend; errors come out as one-line `LogError`s."""

    label: str

    def all(self, stmt: Executable) -> Sequence[Row]: ...

    def chunks(self, stmt: Executable, size: int) -> Iterator[Sequence[Row]]: ...

    def close(self) -> None: ...


def _cols(table: Table, head: str, fields: Sequence[str]) -> list:
    return [table.c[head], *(table.c[f] for f in fields)]


_RUN_COLS = [runs.c[f] for f in RUN_FIELDS]
_INPUT_COLS = _cols(inputs, "id", INPUT_FIELDS)
_CHILD_COLS = {
    "events": _cols(events, "step_id", EVENT_FIELDS),
    "outputs": _cols(outputs, "step_id", OUTPUT_FIELDS),
    "snapshots": _cols(snapshots, "step_id", SNAPSHOT_FIELDS),
}


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


def input_filter(
    run_id: str,
    actor: str | None,
    corr: str | None,
    since: float | None,
    until: float | None,
) -> list[ColumnElement[bool]]:
    if actor is None and corr is None and since is None and until is None:
        return [_Unindexed(inputs.c.run_id) == run_id]
    where = [inputs.c.run_id == run_id]
    if actor is not None:
        where.append(inputs.c.actor == actor)
    if corr is not None:
        where.append(inputs.c.corr == corr)
    if since is not None:
        where.append(inputs.c.t >= since)
    if until is not None:
        where.append(inputs.c.t <= until)
    return where


def children_query(table: Table, ids: Sequence[int]) -> Select:
    step_id = table.c.step_id
    cond = step_id.between(ids[0], ids[-1]) if id_range_is_dense(ids) else step_id.in_(ids)
    return select(*_CHILD_COLS[table.name]).where(cond).order_by(step_id, table.c.id)


class SqlLog:
    """`LogReader` over one database. `run_id=None` means the last run begun."""

    def __init__(self, db: Db) -> None:
        self.db = db
        self.label = db.label

    def runs(self) -> list[RunRec]:
        return [run_from_row(r) for r in self.db.all(select(*_RUN_COLS).order_by(runs.c.id))]

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
        stmt = select(inputs.c.actor).where(inputs.c.run_id == run, inputs.c.seq >= 0).distinct()
        return sorted(r[0] for r in self.db.all(stmt))  # Python order: collation-independent

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
        stmt = select(*_INPUT_COLS).where(*where).order_by(inputs.c.id)
        for chunk in self.db.chunks(stmt, CHUNK):
            ids = [r[0] for r in chunk]
            kids = [self.db.all(children_query(t, ids)) for t in (events, outputs, snapshots)]
            yield from join_steps(chunk, *kids)

    def snapshots(
        self, run_id: str | None = None, actor: str | None = None
    ) -> Iterator[SnapshotRec]:
        run = self.resolve_run(run_id)
        if run is None:
            return
        stmt = select(*_CHILD_COLS["snapshots"]).where(snapshots.c.run_id == run)
        if actor is not None:
            stmt = stmt.where(snapshots.c.actor == actor)
        for chunk in self.db.chunks(stmt.order_by(snapshots.c.id), CHUNK):
            for row in chunk:
                yield snapshot_from_row(row)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> SqlLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
