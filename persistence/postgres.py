"""PostgreSQL backend (SQLAlchemy async + asyncpg): batch store and the reader's database.

All processes of a cluster write one database. Each batch reserves its step ids from
the `inputs` sequence in one round trip, then COPYs the rows (asyncpg's binary COPY,
far faster than INSERT executemany). Both sides are synchronous to their callers
(the writer thread, the `LogReader` protocol): an anyio blocking portal runs the
async engine on its own event loop thread — the caller may itself be inside another
running loop, e.g. the AsyncDriver's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal
from msgspec.structs import astuple
from sqlalchemy import Boolean, Row
from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.sql import Executable

from deepserve.core.records import RunRec, Step

from .errors import LogError, RunExists, one_line
from .group_commit import count_steps, runs_and_steps
from .rows import STEP_TABLES, RunningDigest, rows_of, run_row, step_rows
from .schema import INSERT_COLUMNS, metadata
from .versions import ensure_schema

T = TypeVar("T")


def pg_error(label: str, exc: BaseException) -> LogError:
    if isinstance(exc, LogError):
        return exc
    orig = getattr(exc, "orig", None) or exc
    if isinstance(orig, OSError):
        return LogError(f"{label}: cannot connect to PostgreSQL: {one_line(orig)}")
    return LogError(f"{label}: PostgreSQL error: {type(orig).__name__}: {one_line(orig)}")


async def _prepare(engine: AsyncEngine, label: str, create: bool, upgrade: bool) -> tuple[int, int]:
    async with engine.begin() as conn:
        return await conn.run_sync(ensure_schema, label, create=create, upgrade=upgrade)


class _Portal:
    """An event loop thread (anyio's blocking portal) for one engine's coroutines;
    database errors come out as one-line `LogError`s."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._stack = contextlib.ExitStack()
        self._portal: BlockingPortal = self._stack.enter_context(
            start_blocking_portal("asyncio")  # asyncpg needs asyncio (uvloop included)
        )
        self.closed = False

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self.closed:
            raise LogError(f"{self.label}: the log is closed")
        try:
            return self._portal.call(fn, *args)
        except (DBAPIError, InterfaceError, OSError) as exc:
            raise pg_error(self.label, exc) from None
        except Exception as exc:
            if type(exc).__module__.startswith("asyncpg"):
                raise pg_error(self.label, exc) from None
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._stack.close()


class PgBatchStore:
    """Writes one batch per transaction; created and used only in the writer thread."""

    def __init__(self, url: str, label: str, durability: str) -> None:
        self.label = label
        self.run_id: str | None = None
        self.process = ""
        self.ends: dict[tuple[str, str], RunningDigest] = {}  # as `SqliteBatchStore`'s
        self.engine = create_async_engine(url, poolclass=NullPool)
        self._io = _Portal(label)
        try:
            self._io.call(self._open, durability)
        except BaseException:
            self.close()
            raise

    async def _open(self, durability: str) -> None:
        await _prepare(self.engine, self.label, create=True, upgrade=True)
        self.conn: AsyncConnection | None = await self.engine.connect()
        raw = await self.conn.get_raw_connection()
        self.pg: Any = raw.driver_connection  # the asyncpg connection: COPY lives there
        if durability == "async":
            # The server still writes everything; a commit just doesn't wait for its fsync.
            await self.pg.execute("SET synchronous_commit TO off")
        self.seq = await self.pg.fetchval("SELECT pg_get_serial_sequence('inputs', 'id')")

    def write(self, items: Sequence[Step | RunRec]) -> int:
        steps, (self.run_id, self.process) = self._io.call(self._write, items)
        return steps

    def end_runs(self) -> None:
        rows = [tuple(d.end_row(run_id, process)) for (run_id, process), d in self.ends.items()]
        if rows:
            self._io.call(self._copy, "run_ends", rows)

    async def _write(self, items: Sequence[Step | RunRec]) -> tuple[int, tuple[str | None, str]]:
        n = count_steps(items)
        pg = self.pg
        run_id, process = self.run_id, self.process
        ncols = len(INSERT_COLUMNS["inputs"])
        async with pg.transaction():
            ids: list[int] = []
            if n:
                got = await pg.fetch(
                    "SELECT nextval($1::regclass) FROM generate_series(1, $2)", self.seq, n
                )
                ids = sorted(r[0] for r in got)
            pos = 0
            for part in runs_and_steps(items):
                if isinstance(part, RunRec):
                    await self._check_new_run(part)
                    await self._copy("runs", [tuple(run_row(astuple(part)))])
                    run_id, process = part.run_id, part.process
                    self.ends[(run_id, process)] = RunningDigest()
                    continue
                if run_id is None:
                    raise ValueError("a step was appended before begin_run()")
                # ids from one nextval batch need not be consecutive (a concurrent writer);
                # each row's checksum sums its step's id, so the rows get theirs when built
                rows = step_rows(map(astuple, part), run_id, ids[pos : pos + len(part)], astuple)
                for name, flat in zip(STEP_TABLES, rows, strict=True):
                    if flat:
                        await self._copy(name, rows_of(flat, len(INSERT_COLUMNS[name])))
                self.ends[(run_id, process)].add(rows.inputs[ncols - 1 :: ncols], len(part))
                pos += len(part)
        return n, (run_id, process)

    async def _check_new_run(self, run: RunRec) -> None:
        # Processes of a cluster share the database: the lock serializes two begins of
        # one run id until the first commits (transaction-scoped).
        await self.pg.execute("SELECT pg_advisory_xact_lock(hashtext($1))", run.run_id)
        found = await self.pg.fetchval(
            "SELECT 1 FROM runs WHERE run_id = $1 AND process = $2 LIMIT 1", run.run_id, run.process
        )
        if found is not None:
            raise RunExists(self.label, run.run_id, run.process)

    async def _copy(self, table: str, records: list[tuple]) -> None:
        await self.pg.copy_records_to_table(
            table, records=_bools_back(table, records), columns=INSERT_COLUMNS[table]
        )

    def close(self) -> None:
        async def _close() -> None:
            if getattr(self, "conn", None) is not None:
                await self.conn.close()  # type: ignore[union-attr]
            await self.engine.dispose()

        try:
            self._io.call(_close)
        finally:
            self._io.close()


# Where each table's rows hold booleans: the row builder stores them as 0/1 (as SQLite
# does, rows.py), and COPY wants booleans.
_BOOLS = {
    name: tuple(i for i, c in enumerate(cols) if isinstance(metadata.tables[name].c[c].type, Boolean))
    for name, cols in INSERT_COLUMNS.items()
}


def _bools_back(name: str, rows: list[tuple]) -> list[tuple]:
    at = _BOOLS[name]
    if not at:
        return rows
    out = []
    for r in rows:
        v = list(r)
        for i in at:
            v[i] = bool(v[i])
        out.append(tuple(v))
    return out


class PgDb:
    """The reader's view of a PostgreSQL database (see `sql_reader.Db`)."""

    def __init__(self, url: str, label: str) -> None:
        self.label = label
        self._io = _Portal(label)
        self._engine = create_async_engine(url, pool_size=2, max_overflow=8)

    def prepare(self, *, upgrade: bool) -> tuple[int, int]:
        return self._io.call(_prepare, self._engine, self.label, False, upgrade)

    async def _all(self, stmt: Executable) -> Sequence[Row]:
        async with self._engine.connect() as conn:
            return (await conn.execute(stmt)).all()

    def all(self, stmt: Executable) -> Sequence[Row]:
        return self._io.call(self._all, stmt)

    async def _open_stream(self, stmt: Executable, size: int) -> tuple[AsyncConnection, Any]:
        conn = await self._engine.connect()
        try:
            return conn, await conn.stream(stmt.execution_options(yield_per=size))
        except BaseException:
            await conn.close()
            raise

    def chunks(self, stmt: Executable, size: int) -> Iterator[Sequence[Row]]:
        """Server-side cursor: the server holds the result, we hold one chunk."""
        conn, result = self._io.call(self._open_stream, stmt, size)
        try:
            while rows := self._io.call(result.fetchmany, size):
                yield rows
        finally:
            if not self._io.closed:
                self._io.call(self._close_stream, conn, result)

    @staticmethod
    async def _close_stream(conn: AsyncConnection, result: Any) -> None:
        await result.close()
        await conn.close()

    def close(self) -> None:
        if self._io.closed:
            return
        try:
            self._io.call(self._engine.dispose)
        finally:
            self._io.close()
