"""SQLite files: cheap checks of a file, opening and preparing its schema, errors as
one line, and the reader's database (`SqliteDb`)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Row, create_engine, event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool
from sqlalchemy.sql import Executable

from ..errors import LogError, one_line
from ..schema import SCHEMA_VERSION
from ..versions import ensure_schema, stored_version
from .checks import (  # noqa: F401 - re-exported: this module was their home
    BUSY_MS,
    EMPTY_FILE,
    NO_FILE,
    SQLITE_MAGIC,
    existing_log,
    header_problem,
    sqlite_file_problem,
)

T = TypeVar("T")

def sqlite_error(label: str, exc: BaseException) -> LogError:
    """One line naming the file and what SQLite said, with the likely cause."""
    orig = getattr(exc, "orig", None) or exc
    msg = one_line(orig)
    if "file is not a database" in msg:  # the header check passed: a header SQLite still refuses
        return LogError(f"{label}: not an SQLite database, or its header is corrupt ({msg}), not a deepserve log")
    if "malformed" in msg:
        return LogError(f"{label}: corrupt SQLite file ({msg})")
    return LogError(f"{label}: SQLite error: {msg}")


def sqlite_engine(path: str, *, write: bool) -> Engine:
    """An engine on an existing or new file. Writers take the write lock up front
    (BEGIN IMMEDIATE) so that check-then-create never races another process."""
    # A reader may be handed to another thread (used by one thread at a time). A reader
    # opens the file read-only: a read-write connection, the last to close, checkpoints
    # the WAL into the file and deletes it, so inspecting a copy of a live or killed log
    # changed the evidence (a user tour). Read-only, SQLite still reads the WAL's frames.
    target, uri = (path, False) if write else (read_only_uri(path), True)
    engine = create_engine(
        "sqlite://",
        creator=lambda: sqlite3.connect(
            target, isolation_level=None, timeout=BUSY_MS / 1000, check_same_thread=write, uri=uri
        ),
        poolclass=NullPool,
    )
    if write:

        @event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def read_only_uri(path: str) -> str:
    """The URI that opens `path` read-only (never created, never written, WAL left as is).

    `mode=ro` alone still creates `-wal` and `-shm` files beside a log that has none (SQLite
    needs them to read a WAL-mode file): reading must not write. With no `-wal` there are no
    frames to read and no writer in WAL mode (a writer's connection keeps its `-wal` while it
    lives), so the file is opened `immutable=1`: no locks, no side files. A log with its `-wal`
    (a live or killed writer's) keeps `mode=ro`, which reads the WAL's frames."""
    quoted = urllib.parse.quote(os.path.abspath(path))
    if not os.path.exists(path + "-wal"):
        return f"file:{quoted}?mode=ro&immutable=1"
    return f"file:{quoted}?mode=ro"


def prepare_sqlite(path: str, *, create: bool, upgrade: bool, page_bytes: int = 0) -> tuple[int, int]:
    """Check the file, create or migrate its schema; returns (version found, now).
    A current log is only read here: readers never take the write lock. `page_bytes`: the
    SQLite page size of a log created here (0: SQLite's default, 4 KiB); an existing file
    keeps its own."""
    exists = existing_log(path, create)
    if exists:
        version = _run(path, False, lambda conn: stored_version(conn, path))
        if version == SCHEMA_VERSION:
            return version, version

    def _setup(conn: Connection) -> tuple[int, int]:
        if not exists:  # WAL is persistent, and cannot be switched on inside a transaction
            raw: Any = conn.connection.driver_connection
            if page_bytes:  # before the first write: it fixes the file's page size
                raw.execute(f"PRAGMA page_size={int(page_bytes)}")
            raw.execute("PRAGMA journal_mode=WAL")
        with conn.begin():
            return ensure_schema(conn, path, create=create, upgrade=upgrade)

    # a reader only learns why it cannot read (older or newer schema): read-only
    return _run(path, create or upgrade, _setup)


def _run(path: str, write: bool, fn: Callable[[Connection], T]) -> T:
    engine = sqlite_engine(path, write=write)
    try:
        with engine.connect() as conn:
            return fn(conn)
    except DBAPIError as exc:
        raise sqlite_error(path, exc) from None
    except UnicodeDecodeError as exc:  # sqlite3 decodes text it reads: the schema's, here
        raise LogError(f"{path}: damaged SQLite file, refusing to read it: text that is not "
                       f"UTF-8 where its schema is stored ({exc.reason} at byte {exc.start})") from None
    finally:
        engine.dispose()


def integrity_problems(conn: sqlite3.Connection, max_errors: int = 10) -> list[str]:
    """What `PRAGMA integrity_check` finds wrong in the file (empty: intact).

    Not `quick_check`: overwriting 16 bytes of an index page of a demo log changes
    index keys that quick_check (page structure only) accepts, while the index no
    longer matches its table — and a filtered read (`--actor`, `--corr`, `--since`)
    through that index answers wrongly. integrity_check also compares every index
    with its table. Cost (docs/kernel.md): about 3x quick_check, a few seconds for
    a 1M-input log."""
    try:
        rows = conn.execute(f"PRAGMA integrity_check({int(max_errors)})").fetchall()
    except UnicodeDecodeError as exc:  # SQLite's error quotes a damaged schema's bytes
        return [f"text that is not UTF-8 where its schema is stored ({exc.reason} at byte {exc.start})"]
    problems = [one_line(r[0]) for r in rows]
    return [] if problems == ["ok"] else problems


class SqliteDb:
    """The reader's view of one file: SQLAlchemy Core queries, streamed in chunks."""

    def __init__(self, path: str) -> None:
        self.label = path
        self.path = path
        self._engine = sqlite_engine(path, write=False)
        try:
            self._conn = self._engine.connect()
        except DBAPIError as exc:
            self._engine.dispose()
            raise sqlite_error(path, exc) from None

    @property
    def raw(self) -> sqlite3.Connection:
        """The sqlite3 connection underneath, for the fast step reader (`log_reader`):
        SQLAlchemy's result rows cost ~2 µs a step more than sqlite3's tuples."""
        if self._conn.closed:
            raise LogError(f"{self.label}: the log is closed")
        return self._conn.connection.driver_connection  # type: ignore[return-value]

    def all(self, stmt: Executable) -> Sequence[Row]:
        try:
            return self._conn.execute(stmt).all()
        except DBAPIError as exc:
            raise sqlite_error(self.label, exc) from None

    def chunks(self, stmt: Executable, size: int) -> Iterator[Sequence[Row]]:
        """Rows `size` at a time from one open cursor: SQLite steps it lazily, so a
        log of any length streams in bounded memory."""
        with self.errors():
            result = self._conn.execute(stmt.execution_options(yield_per=size))
        try:
            while True:
                with self.errors():
                    rows = result.fetchmany(size)
                if not rows:
                    return
                yield rows
        finally:
            result.close()

    def check_integrity(self) -> None:
        with self.errors():
            problems = integrity_problems(self.raw)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise LogError(
                f"{self.label}: damaged SQLite file, refusing to read it: {problems[0]}{more} "
                "(PRAGMA integrity_check)"
            )

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """DB-API errors (SQLAlchemy's or sqlite3's own) as one-line `LogError`s."""
        try:
            yield
        except (DBAPIError, sqlite3.Error) as exc:
            raise sqlite_error(self.label, exc) from None

    def close(self) -> None:
        self._conn.close()
        self._engine.dispose()
