"""The integrity check of a log that cannot be opened for reading yet.

Reading commands call `LogReader.check_integrity()` (persistence: `PRAGMA
integrity_check` on every SQLite file; `quick_check` misses damaged index keys, see
docs/kernel.md). `replay migrate` must refuse a damaged file too — rewriting it would
hide the damage — but a log of an older schema cannot be opened as a reader, so this
runs the same check (`persistence.sqlite.files.integrity_problems`) on the files of a
target directly.
"""

from __future__ import annotations

import os
import sqlite3

from deepserve.persistence.api import LogError
from deepserve.persistence.errors import one_line
from deepserve.persistence.factory import log_files
from deepserve.persistence.sqlite.files import (
    integrity_problems,
    read_only_uri,
    sqlite_file_problem,
)
from deepserve.persistence.target import parse_target

BUSY_S = 10.0  # wait this long for a live writer's lock


def check_integrity(target: str) -> None:
    """Raise the reader's one-line `LogError` if any SQLite file of `target` (a file, or
    every `*.db` of a directory) is damaged; PostgreSQL checks its own pages."""
    tgt = parse_target(target)
    if tgt.kind != "sqlite":
        return
    paths = log_files(tgt.path) if os.path.isdir(tgt.path) else [tgt.path]
    for path in paths:
        if sqlite_file_problem(path) is not None:
            continue  # missing, empty, not SQLite: the opener says so in its own words
        problems = _problems(path)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise LogError(
                f"{path}: damaged SQLite file, refusing to read it: {problems[0]}{more} "
                "(PRAGMA integrity_check)"
            )


def _problems(path: str) -> list[str]:
    # read-only: never create a missing file (a plain connect would), never checkpoint a WAL
    uri = read_only_uri(path)
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_S)
    except sqlite3.Error as exc:
        return [one_line(exc)]
    try:
        conn.execute("PRAGMA query_only = ON")
        return integrity_problems(conn)
    except sqlite3.DatabaseError as exc:
        return [one_line(exc)]
    finally:
        conn.close()
