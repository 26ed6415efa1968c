"""SQL views in a SQLite log: one row per request, per routing decision and per fault, for anyone
with `sqlite3` (`deepserve replay export LOG --format sql`; docs/replay-report.md).

A log's records are msgpack (rows' payloads; a simulation's steps are zstd pages of them), which
SQL cannot read. So the rows are materialized on demand into three tables of their own
(`derived_requests`, `derived_decisions`, `derived_faults`, keyed by run) and the views
(`requests`, `decisions`, `faults`) read those, adding what is computed from them (latencies in
ms, whether the request met the run's SLO). They are never part of a run's record: the record
tables, their CRCs, `replay verify` and `replay digest` do not see them, and exporting again
replaces a run's rows (written in one transaction).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from .errors import LogError

SQL_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "REAL", "bool": "INTEGER"}
PREFIX = "derived_"

# The views: each table's columns (all, `run_id` first) plus what is derived from them.
VIEWS = {
    "requests": (
        "SELECT r.*, (r.first_token_s - r.arrival_s) * 1e3 AS ttft_ms_all, "
        "(r.finish_s - r.arrival_s) * 1e3 AS e2e_ms_all, "
        "r.status = 'failed' AND r.reason LIKE '429 refused: %' AS refused "
        "FROM derived_requests r"
    ),
    "decisions": (
        "SELECT d.*, r.status AS request_status, r.te AS request_te "
        "FROM derived_decisions d LEFT JOIN derived_requests r ON r.run_id = d.run_id AND r.request_id = d.request_id"
    ),
    "faults": "SELECT * FROM derived_faults",
}


def write_views(path: str, run_id: str, columns: dict[str, dict[str, str]], rows: dict[str, list[dict[str, Any]]]) -> None:
    """Store `rows` (table -> its rows, `columns` -> their names and kinds) for `run_id` in the
    SQLite log at `path` and (re)create the views over them."""
    try:
        conn = sqlite3.connect(path, timeout=30.0)
    except sqlite3.Error as exc:
        raise LogError(f"{path}: cannot open the log for writing its views ({exc})") from None
    try:
        with conn:
            for name, cols in columns.items():
                _table(conn, name, cols, run_id, rows[name])
            for name, select in VIEWS.items():
                conn.execute(f"DROP VIEW IF EXISTS {name}")
                conn.execute(f"CREATE VIEW {name} AS {select}")
    except sqlite3.Error as exc:
        raise LogError(f"{path}: writing the views failed ({exc})") from None
    finally:
        conn.close()


def _table(conn: sqlite3.Connection, name: str, cols: dict[str, str], run_id: str, rows: list[dict[str, Any]]) -> None:
    table = PREFIX + name
    spec = ", ".join(f'"{c}" {SQL_TYPES[k]}' for c, k in cols.items())
    have = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    if have and have != ["run_id", *cols]:  # written by another deepserve: its columns differ
        conn.execute(f"DROP TABLE {table}")
    conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (run_id TEXT NOT NULL, {spec})")
    conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
    marks = ", ".join("?" * (len(cols) + 1))
    conn.executemany(f"INSERT INTO {table} VALUES ({marks})", ([run_id, *(r[c] for c in cols)] for r in rows))
    conn.execute(f"CREATE INDEX IF NOT EXISTS ix_{table}_run ON {table} (run_id)")
