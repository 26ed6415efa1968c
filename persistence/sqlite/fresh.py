"""A new SQLite log and its writer's statements, without SQLAlchemy.

SQLAlchemy owns the schema (`schema.py`) and compiles every statement a reader or a
migration runs, but importing it costs ~0.3 s of CPU: a third of what a split `deepserve
sim` spends before its workers start, paid again by every `deepserve sim` run. Writing a
new log needs only the statements below, compiled from that schema once and kept here;
`tests/persistence/test_fresh_log.py` compiles them again with SQLAlchemy and fails, with
the statement to paste, whenever the schema changes. An existing file (another version,
or another run's log) still goes through `files.prepare_sqlite`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from typing import Any

from ..errors import LogError, one_line
from .checks import BUSY_MS, existing_log

SCHEMA_VERSION = 7  # `schema.SCHEMA_VERSION` (the test checks they agree)

# What `metadata.create_all` runs on SQLite, table by table, in the order it runs them.
CREATE_SCHEMA: tuple[str, ...] = (
    "CREATE TABLE events (id INTEGER NOT NULL, step_id BIGINT NOT NULL, run_id TEXT NOT NULL, "
    "actor TEXT NOT NULL, seq BIGINT NOT NULL, idx INTEGER NOT NULL, type TEXT NOT NULL, "
    "payload BLOB NOT NULL, crc32 BIGINT DEFAULT '0' NOT NULL, PRIMARY KEY (id))",
    "CREATE INDEX ix_events_step ON events (step_id)",
    "CREATE TABLE inputs (id INTEGER NOT NULL, run_id TEXT NOT NULL, actor TEXT NOT NULL, "
    "seq BIGINT NOT NULL, t DOUBLE NOT NULL, hlc BIGINT NOT NULL, kind INTEGER NOT NULL, "
    "src TEXT NOT NULL, msg_id BIGINT NOT NULL, corr TEXT, reply_to BIGINT, "
    "external BOOLEAN NOT NULL, type TEXT NOT NULL, payload BLOB NOT NULL, "
    "ask BOOLEAN DEFAULT 0 NOT NULL, src_hlc BIGINT DEFAULT '0' NOT NULL, "
    "crc32 BIGINT DEFAULT '0' NOT NULL, PRIMARY KEY (id))",
    "CREATE INDEX ix_inputs_actor ON inputs (run_id, actor, seq)",
    "CREATE INDEX ix_inputs_corr ON inputs (run_id, corr)",
    "CREATE INDEX ix_inputs_t ON inputs (run_id, t)",
    "CREATE TABLE outputs (id INTEGER NOT NULL, step_id BIGINT NOT NULL, run_id TEXT NOT NULL, "
    "actor TEXT NOT NULL, seq BIGINT NOT NULL, idx INTEGER NOT NULL, kind INTEGER NOT NULL, "
    "dst TEXT NOT NULL, msg_id BIGINT NOT NULL, delay DOUBLE NOT NULL, \"key\" TEXT, corr TEXT, "
    "reply_to BIGINT, ask BOOLEAN NOT NULL, type TEXT NOT NULL, payload BLOB NOT NULL, "
    "crc32 BIGINT DEFAULT '0' NOT NULL, PRIMARY KEY (id))",
    "CREATE INDEX ix_outputs_step ON outputs (step_id)",
    "CREATE TABLE pages (id INTEGER NOT NULL, run_id TEXT NOT NULL, first_step BIGINT NOT NULL, "
    "steps INTEGER NOT NULL, t_first DOUBLE NOT NULL, t_last DOUBLE NOT NULL, "
    "body BLOB NOT NULL, crc32 BIGINT NOT NULL, PRIMARY KEY (id))",
    "CREATE INDEX ix_pages_run ON pages (run_id, id)",
    "CREATE TABLE run_ends (id INTEGER NOT NULL, run_id TEXT NOT NULL, process TEXT NOT NULL, "
    "steps BIGINT NOT NULL, units BIGINT NOT NULL, digest TEXT NOT NULL, "
    "ended_at DOUBLE NOT NULL, crc32 BIGINT NOT NULL, PRIMARY KEY (id))",
    "CREATE INDEX ix_run_ends_run ON run_ends (run_id, process)",
    "CREATE TABLE runs (id INTEGER NOT NULL, run_id TEXT NOT NULL, mode TEXT NOT NULL, "
    "seed BIGINT NOT NULL, config TEXT NOT NULL, code_version TEXT NOT NULL, host TEXT NOT NULL, "
    "started_at DOUBLE NOT NULL, process TEXT DEFAULT 'main' NOT NULL, "
    "crc32 BIGINT DEFAULT '0' NOT NULL, PRIMARY KEY (id))",
    "CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at DOUBLE NOT NULL, "
    "PRIMARY KEY (version))",
    "CREATE TABLE snapshots (id INTEGER NOT NULL, step_id BIGINT NOT NULL, "
    "run_id TEXT NOT NULL, actor TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL, "
    "payload BLOB NOT NULL, crc32 BIGINT DEFAULT '0' NOT NULL, PRIMARY KEY (id))",
    "CREATE INDEX ix_snapshots_actor ON snapshots (run_id, actor, seq)",
    "CREATE INDEX ix_snapshots_step ON snapshots (step_id)",
)
RECORD_VERSION = "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)"
# The page writer's single-row INSERTs, parameters in `schema.INSERT_COLUMNS` order.
INSERT_RUN = (
    "INSERT INTO runs (run_id, mode, seed, config, code_version, host, started_at, process, "
    "crc32) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_PAGE = (
    "INSERT INTO pages (run_id, first_step, steps, t_first, t_last, body, crc32) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
INSERT_RUN_END = (
    "INSERT INTO run_ends (run_id, process, steps, units, digest, ended_at, crc32) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
RUN_COLUMNS = 9
RUN_ID_INDEX = 0  # `RunRec.run_id` and `RunRec.process` among the run's fields
PROCESS_INDEX = 7

# async: nothing crashes for real in sim, and a WAL commit without fsync still survives
# a process kill (the pages are in the OS cache). outbox: NORMAL keeps the file
# consistent across power loss too; pass synchronous="full" to also fsync every commit.
SYNCHRONOUS = {"async": "OFF", "outbox": "NORMAL"}


def writer_pragmas(durability: str, synchronous: str | None = None, cache_kib: int | None = None) -> list[str]:
    """The writer connection's settings (thread and process writers alike). `cache_kib`: its page
    cache (default 64 MiB: index pages stay hot across batches; a daemon, which appends for days,
    asks for less — the cache filled to 64 MiB was most of a daemon's RSS growth, issue 30)."""
    sync = (synchronous or SYNCHRONOUS[durability]).upper()
    return [
        f"synchronous={sync}",
        f"busy_timeout={BUSY_MS}",
        f"cache_size=-{int(cache_kib or 65536)}",
    ]


def max_id_sql() -> str:
    """The last step id given out, in rows (`inputs.id`) or pages: both layouts draw
    from one sequence. Both lookups are O(1): the rowid's maximum, and the last page
    (pages are inserted in step-id order, under the write lock)."""
    return (
        "SELECT max(coalesce((SELECT max(id) FROM inputs), 0), "
        "coalesce((SELECT first_step + steps - 1 FROM pages ORDER BY id DESC LIMIT 1), 0))"
    )


def process_writer_config(path: str, synchronous: str | None) -> dict[str, Any]:
    """What the writer process (`child.py`) needs: it does not import SQLAlchemy."""
    return {
        "path": os.path.abspath(path),
        "label": path,
        "timeout": BUSY_MS / 1000,
        # Its logs have 64 KiB pages: SQLite's default checkpoint, every 1,000 pages, would
        # let the WAL grow to 64 MB and copy it all back when `close()` waits (38 ms of a
        # 0.7 s logged run, measured). 64 pages is the default's 4 MB, checkpointed in the
        # writer process while the driver runs.
        "pragmas": [*writer_pragmas("async", synchronous), "wal_autocheckpoint=64"],
        "runs_sql": INSERT_RUN,
        "runs_cols": RUN_COLUMNS,
        "page_sql": INSERT_PAGE,
        "end_sql": INSERT_RUN_END,
        "max_id_sql": max_id_sql(),
        "run_id_index": RUN_ID_INDEX,
        "process_index": PROCESS_INDEX,
    }


def create_log(path: str, *, page_bytes: int = 0) -> bool:
    """Give a new (absent or empty) file the current schema, as `prepare_sqlite` would;
    False when `path` holds a database already (then `prepare_sqlite` checks it), including
    one another process created between the check and the write lock."""
    if existing_log(path, create=True):
        return False
    _private(path)
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_MS / 1000)
    except sqlite3.Error as exc:
        raise LogError(f"{path}: cannot create the log: {one_line(exc)}") from None
    try:
        return _create(conn, page_bytes)
    except sqlite3.Error as exc:
        raise LogError(f"{path}: SQLite error: {one_line(exc)}") from None
    finally:
        conn.close()


def _private(path: str) -> None:
    """A new log is its user's alone (0600, whatever the umask; SQLite gives the -wal and -shm
    files the log's mode): a daemon's log holds every request's prompt. An empty file the user
    made keeps its mode."""
    with contextlib.suppress(OSError):  # SQLite says what is wrong when it opens the path
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _create(conn: sqlite3.Connection, page_bytes: int) -> bool:
    if page_bytes:  # before the first write: it fixes the file's page size
        conn.execute(f"PRAGMA page_size={int(page_bytes)}")
    conn.execute("PRAGMA journal_mode=WAL")  # persistent; not inside a transaction
    conn.execute("BEGIN IMMEDIATE")  # the write lock first: check-then-create cannot race
    try:
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            conn.execute("ROLLBACK")
            return False
        for statement in CREATE_SCHEMA:
            conn.execute(statement)
        conn.execute(RECORD_VERSION, (SCHEMA_VERSION, time.time()))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return True
