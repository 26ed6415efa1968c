"""PostgreSQL backend (SQLAlchemy async + asyncpg): batch store and the reader's database.

All processes of a cluster write one database. The writer thread runs its own event
loop; each batch reserves its step ids from the `inputs` sequence in one round trip,
then COPYs the rows (asyncpg's binary COPY, far faster than INSERT executemany). The
reader is synchronous (the `LogReader` protocol): a private loop thread runs the async
engine and the generator fetches server-side-cursor chunks through it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Row
from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.sql import Executable

from deepserve.core.records import RunRec, Step

from .api import LogError
from .migrate import ensure_schema
from .rows import batch_rows, count_steps
from .schema import INSERT_COLUMNS
from .target import one_line

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


class PgBatchStore:
    """Writes one batch per transaction; created and used only in the writer thread."""

    def __init__(self, url: str, label: str, durability: str) -> None:
        self.label = label
        self.run_id: str | None = None
        self.loop = asyncio.new_event_loop()
        self.engine = create_async_engine(url, poolclass=NullPool)
        try:
            self.loop.run_until_complete(self._open(durability))
        except BaseException as exc:
            self.loop.run_until_complete(self.engine.dispose())
            self.loop.close()
            raise pg_error(label, exc) from None

    async def _open(self, durability: str) -> None:
        await _prepare(self.engine, self.label, create=True, upgrade=True)
        self.conn = await self.engine.connect()
        raw = await self.conn.get_raw_connection()
        self.pg: Any = raw.driver_connection  # the asyncpg connection: COPY lives there
        if durability == "async":
            # The server still writes everything; a commit just doesn't wait for its fsync.
            await self.pg.execute("SET synchronous_commit TO off")
        self.seq = await self.pg.fetchval("SELECT pg_get_serial_sequence('inputs', 'id')")

    def write(self, items: Sequence[Step | RunRec]) -> int:
        return self.loop.run_until_complete(self._write(items))

    async def _write(self, items: Sequence[Step | RunRec]) -> int:
        n = count_steps(items)
        pg = self.pg
        async with pg.transaction():
            ids: list[int] = []
            if n:
                got = await pg.fetch(
                    "SELECT nextval($1::regclass) FROM generate_series(1, $2)", self.seq, n
                )
                ids = sorted(r[0] for r in got)
            rows = batch_rows(items, self.run_id, iter(ids))
            for name, data in zip(INSERT_COLUMNS, rows[:5], strict=True):
                if data:
                    await pg.copy_records_to_table(name, records=data, columns=INSERT_COLUMNS[name])
        self.run_id = rows.run_id
        return rows.steps

    def close(self) -> None:
        async def _close() -> None:
            await self.conn.close()
            await self.engine.dispose()

        try:
            self.loop.run_until_complete(_close())
        finally:
            self.loop.close()


class LoopThread:
    """A private event loop in a daemon thread, for sync callers of async code (the
    caller may itself be inside another running loop, e.g. the AsyncDriver's)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class PgDb:
    """The reader's view of a PostgreSQL database (see `reader.Db`)."""

    def __init__(self, url: str, label: str) -> None:
        self.label = label
        self._io = LoopThread(f"deepserve-log-reader:{label}")
        self._engine = create_async_engine(url, pool_size=2, max_overflow=8)
        self._closed = False

    def prepare(self, *, upgrade: bool) -> tuple[int, int]:
        return self._call(_prepare(self._engine, self.label, False, upgrade))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise LogError(f"{self.label}: the log is closed")
        try:
            return self._io.run(coro)
        except (DBAPIError, InterfaceError, OSError) as exc:
            raise pg_error(self.label, exc) from None
        except Exception as exc:
            if type(exc).__module__.startswith("asyncpg"):
                raise pg_error(self.label, exc) from None
            raise

    async def _all(self, stmt: Executable) -> Sequence[Row]:
        async with self._engine.connect() as conn:
            return (await conn.execute(stmt)).all()

    def all(self, stmt: Executable) -> Sequence[Row]:
        return self._call(self._all(stmt))

    async def _open_stream(self, stmt: Executable, size: int) -> tuple[AsyncConnection, Any]:
        conn = await self._engine.connect()
        try:
            return conn, await conn.stream(stmt.execution_options(yield_per=size))
        except BaseException:
            await conn.close()
            raise

    def chunks(self, stmt: Executable, size: int) -> Iterator[Sequence[Row]]:
        """Server-side cursor: the server holds the result, we hold one chunk."""
        conn, result = self._call(self._open_stream(stmt, size))
        try:
            while rows := self._call(result.fetchmany(size)):
                yield rows
        finally:
            if not self._closed:
                self._call(self._close_stream(conn, result))

    @staticmethod
    async def _close_stream(conn: AsyncConnection, result: Any) -> None:
        await result.close()
        await conn.close()

    def close(self) -> None:
        if self._closed:
            return
        self._io.run(self._engine.dispose())
        self._closed = True
        self._io.close()
