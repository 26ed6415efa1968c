"""Cheap checks of an SQLite file, from its header and size alone (standard library only:
the writer's side of a log, `fresh.py`, is created without SQLAlchemy)."""

from __future__ import annotations

import os

from ..errors import LogError

BUSY_MS = 10_000  # wait this long for another connection's write lock
SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER = 100
NO_FILE = "no such file or directory"
EMPTY_FILE = "empty file (0 bytes), not a deepserve log"


def _be_int(data: bytes) -> int:
    return int.from_bytes(data, "big")


def header_problem(header: bytes, size: int, has_wal: bool) -> str | None:
    """What is wrong with an SQLite file, judged from its first 100 bytes and its size
    alone (pure: unit-tested without files)."""
    if size == 0:
        return EMPTY_FILE
    if not header.startswith(SQLITE_MAGIC[: min(len(header), 16)]):
        return "not an SQLite database (bad file header), not a deepserve log"
    if size < _HEADER:
        return f"truncated: {size} bytes, shorter than the 100-byte SQLite header"
    page_size = _be_int(header[16:18])
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return f"corrupt SQLite header (page size {page_size})"
    if has_wal:
        # A live or crashed writer: pages may still be in the -wal file, so the main
        # file's size says nothing yet; SQLite recovers it on open.
        return None
    pages = _be_int(header[28:32])
    header_valid = pages > 0 and header[24:28] == header[92:96]
    expected = pages * page_size
    if header_valid and size < expected:
        return f"truncated: {size} bytes, but its header says {pages} pages of {page_size} bytes"
    if size % page_size:
        return f"truncated: {size} bytes is not a whole number of {page_size}-byte pages"
    return None


def sqlite_file_problem(path: str) -> str | None:
    """None if `path` looks like a whole SQLite file; else one line saying why not."""
    if not os.path.exists(path):
        return NO_FILE
    if os.path.isdir(path):
        return "is a directory"
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header = f.read(_HEADER)
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    wal = path + "-wal"
    has_wal = os.path.exists(wal) and os.path.getsize(wal) > 0
    return header_problem(header, size, has_wal)


def existing_log(path: str, create: bool) -> bool:
    """Whether `path` holds a database already; raises for anything unusable."""
    problem = sqlite_file_problem(path)
    if problem is None:
        return True
    if create and problem in (NO_FILE, EMPTY_FILE):  # `touch run.db` is a fine start
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise LogError(f"{path}: cannot create the log: no such directory {parent}")
        return False
    raise LogError(f"{path}: {problem}")
