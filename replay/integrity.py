"""Is the log's file whole? Checked before any replay command answers from it.

An incident log is evidence: a damaged SQLite index makes queries return the
wrong rows without any error (a step's events missing, an actor's inputs skipped),
so `verify` can say identical and `state` answer from the wrong step. SQLite's
`PRAGMA integrity_check` catches this; `quick_check` does not, because it skips
the comparison of each index with its table, which is exactly what goes wrong
when an index page is overwritten (measured: 17 of 103 16-byte overwrites of
index pages passed `quick_check` and failed `integrity_check`). Its cost on a
large log is in docs/kernel.md ("Replaying a log").

PostgreSQL checks its own pages (checksums, WAL replay); a server-side check of a
whole database would need the `amcheck` extension, so nothing is checked here.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse

from deepserve.persistence.api import LogError
from deepserve.persistence.factory import log_files
from deepserve.persistence.sqlite.files import sqlite_file_problem
from deepserve.persistence.target import parse_target

BUSY_S = 10.0  # wait this long for a live writer's lock


def check_integrity(target: str) -> None:
    """Raise a one-line `LogError` naming the file and SQLite's first complaint if
    any SQLite file of `target` (a file, or every `*.db` of a directory) is damaged."""
    tgt = parse_target(target)
    if tgt.kind != "sqlite":
        return
    paths = log_files(tgt.path) if os.path.isdir(tgt.path) else [tgt.path]
    for path in paths:
        if sqlite_file_problem(path) is not None:
            continue  # missing, empty, not SQLite: the opener says so in its own words
        problem = sqlite_problem(path)
        if problem is not None:
            raise LogError(f"{path}: damaged log: SQLite integrity check failed: {problem}")


def sqlite_problem(path: str) -> str | None:
    """SQLite's first complaint about the file at `path` (one line), or None if whole."""
    # mode=rw: never create a missing file (a plain connect would)
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=rw"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_S)
    except sqlite3.Error as exc:
        return " ".join(str(exc).split())
    try:
        conn.execute("PRAGMA query_only = ON")
        # integrity_check(1): stop at the first error; its message names the page or index
        rows = conn.execute("PRAGMA integrity_check(1)").fetchall()
    except sqlite3.DatabaseError as exc:
        return " ".join(str(exc).split())
    finally:
        conn.close()
    text = " ".join(" ".join(str(r[0]) for r in rows).split())
    if text == "ok":
        return None
    return text.removeprefix("*** in database main *** ")
