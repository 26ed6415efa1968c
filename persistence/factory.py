"""Opening logs by target: `open_sink` (the process's writer), `open_log` (a reader),
`migrate` (the explicit schema upgrade). The imperative shell around the backends.

The readers, the thread writer and schema migrations need SQLAlchemy and are imported when
used: a simulation's writer process on a new SQLite file does not (`sqlite/fresh.py`)."""

from __future__ import annotations

import glob
import os
import re
from typing import TYPE_CHECKING, Any, Literal

from .api import Durability, LogReader
from .errors import LogError
from .group_commit import GroupCommitSink
from .sqlite.fresh import create_log
from .sqlite.process_writer import ProcessSink
from .target import Target, parse_target

if TYPE_CHECKING:
    from .sql_reader import SqlLog
    from .sqlite.log_reader import SqliteLog

Writer = Literal["thread", "process"]
Layout = Literal["pages", "rows"]
PAGE_LOG_BYTES = 65536  # SQLite page size of a log the writer process creates


def open_sink(
    target: str,
    durability: Durability = "async",
    *,
    process: str | None = None,
    synchronous: str | None = None,
    max_pending: int | None = None,
    max_batch: int | None = None,
    high_water: int | None = None,
    writer: Writer = "thread",
    linger_s: float = 0.0,
    flush_s: float = 0.0,
    cache_kib: int | None = None,
    layout: Layout = "pages",
) -> GroupCommitSink | ProcessSink:
    """The process's log writer (a `LogSink`), creating or migrating the log.

    `target`: a file path, an existing directory (then the file is `<process>.db` in
    it: one file per process of a daemon run), `sqlite:///PATH` or a PostgreSQL URL.
    `synchronous`: SQLite override (off/normal/full); full fsyncs every commit.
    `max_pending` / `max_batch`: queue bound (backpressure) and steps per transaction.
    `high_water`: pending steps at which the sink is under pressure (default
    max_pending // 2; see `pressure.py`).
    `linger_s` (the thread writer): how long the writer, woken from idle, waits for more
    steps before it commits (a daemon's steps trickle in; see group_commit.py). `flush_s` (the
    thread writer, `async` only): at most a commit every `flush_s` unless someone waits for one
    (bigger pages: a daemon's log ~2x smaller at 0.25 s; a killed process loses the window's
    steps). `cache_kib`:
    the thread writer's SQLite page cache (default 64 MiB; sqlite/fresh.py).
    `layout` (the SQLite thread writer): "pages" stores each transaction's steps as one zstd
    page (`sqlite/page_store.py`: a daemon's log ~7x smaller); "rows" a row per record, indexed
    by actor, correlation id and time. PostgreSQL and the writer process ignore it (rows, pages).
    `writer="process"`: an `async` SQLite log is written by a child process (see
    `sqlite.process_writer`: for runs that end with close(), such as sim runs); a PostgreSQL target
    or a non-POSIX system keeps the thread writer.
    """
    if durability not in ("async", "outbox"):
        raise ValueError(f"durability must be 'async' or 'outbox', not {durability!r}")
    if writer not in ("thread", "process"):
        raise ValueError(f"writer must be 'thread' or 'process', not {writer!r}")
    if writer == "process" and durability != "async":
        # outbox releases outputs on commit: it needs the thread writer's eager batches
        raise ValueError("writer='process' is for durability='async' only")
    if layout not in ("pages", "rows"):
        raise ValueError(f"layout must be 'pages' or 'rows', not {layout!r}")
    if synchronous is not None and synchronous.lower() not in ("off", "normal", "full"):
        raise ValueError(f"synchronous must be off, normal or full, not {synchronous!r}")
    tgt = parse_target(target)
    limits: dict[str, Any] = {
        k: v
        for k, v in (("max_pending", max_pending), ("max_batch", max_batch), ("high_water", high_water))
        if v is not None
    }
    if tgt.kind == "postgresql":
        from .postgres import PgBatchStore

        return GroupCommitSink(
            lambda: PgBatchStore(tgt.url, tgt.label, durability),
            label=tgt.label,
            durability=durability,
            linger_s=linger_s,
            flush_s=flush_s,
            **limits,
        )
    path = tgt.path
    if os.path.isdir(path):
        # one file per process; a process name like "te/3" must not make a subdirectory
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", process or "main")
        path = os.path.join(path, f"{name}.db")
    process_writer = writer == "process" and os.name == "posix"  # pipes passed by fd number
    # The writer process stores ~130 KB pages of steps (pages.py), one blob a transaction: in
    # 64 KiB SQLite pages a blob is 3 pages to write to the WAL and then the database, not 33
    # (the writer's system time -20 %, measured). Row logs keep 4 KiB: their small commits
    # would rewrite whole 64 KiB pages.
    page_bytes = PAGE_LOG_BYTES if process_writer else 0
    if not create_log(path, page_bytes=page_bytes):  # a database already: check or migrate it
        from .sqlite.files import prepare_sqlite

        prepare_sqlite(path, create=True, upgrade=True, page_bytes=page_bytes)
    if process_writer:
        return ProcessSink(path, synchronous=synchronous, **limits)
    sink_class = GroupCommitSink
    if layout == "pages":
        from .paged_sink import PagedGroupCommitSink as sink_class  # takes a driver's own pages
        from .sqlite.page_store import SqlitePageStore as Store
    else:
        from .sqlite.batch_store import SqliteBatchStore as Store  # type: ignore[assignment]

    return sink_class(
        lambda: Store(path, durability, synchronous, cache_kib),
        label=path,
        durability=durability,
        linger_s=linger_s,
        flush_s=flush_s,
        **limits,
    )


def open_log(target: str, *, upgrade: bool = True) -> LogReader:
    """A streaming reader. A directory merges its `*.db` files by HLC. A log of an
    older schema version is migrated first (`upgrade=False`: refuse with a LogError
    that asks for `migrate`). Anything unreadable is a one-line `LogError`."""
    tgt = parse_target(target)
    if tgt.kind == "postgresql":
        return _open_pg(tgt, upgrade)
    path = tgt.path
    if os.path.isdir(path):
        from .merged_reader import MergedLog

        files = log_files(path)
        logs: list[SqlLog] = []
        try:
            for f in files:
                logs.append(_open_sqlite(f, upgrade))
        except BaseException:
            for log in logs:
                log.close()
            raise
        return MergedLog(path, logs)
    return _open_sqlite(path, upgrade)


def log_files(directory: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(glob.escape(directory), "*.db")))
    if not files:
        raise LogError(f"{directory}: no *.db log files in this directory")
    return files


def _open_sqlite(path: str, upgrade: bool) -> SqliteLog:
    from .sqlite.files import SqliteDb, prepare_sqlite
    from .sqlite.log_reader import SqliteLog

    prepare_sqlite(path, create=False, upgrade=upgrade)
    return SqliteLog(SqliteDb(path))


def _open_pg(tgt: Target, upgrade: bool) -> SqlLog:
    from .postgres import PgDb
    from .sql_reader import SqlLog

    db = PgDb(tgt.url, tgt.label)
    try:
        db.prepare(upgrade=upgrade)
    except BaseException:
        db.close()
        raise
    return SqlLog(db)


def migrate(target: str) -> dict[str, tuple[int, int]]:
    """Upgrade a log (every `*.db` of a directory) to the current schema version, in
    one transaction per database. Returns {file or URL: (version before, after)}."""
    tgt = parse_target(target)
    if tgt.kind == "postgresql":
        from .postgres import PgDb

        db = PgDb(tgt.url, tgt.label)
        try:
            return {tgt.label: db.prepare(upgrade=True)}
        finally:
            db.close()
    from .sqlite.files import prepare_sqlite

    paths = log_files(tgt.path) if os.path.isdir(tgt.path) else [tgt.path]
    return {p: prepare_sqlite(p, create=False, upgrade=True) for p in paths}


__all__ = ["log_files", "migrate", "open_log", "open_sink"]
