"""Where a log lives: parsing a target string, and cheap checks of an SQLite file.

A target is a plain path (SQLite; a directory means one file per process), an
`sqlite:///PATH` URL, or a `postgresql://` / `postgresql+asyncpg://` URL.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from .api import LogError

SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER = 100
NO_FILE = "no such file or directory"
EMPTY_FILE = "empty file (0 bytes), not a deepserve log"


class Target(NamedTuple):
    kind: str  # "sqlite" | "postgresql"
    path: str  # SQLite file or directory ("" for PostgreSQL)
    url: str  # SQLAlchemy URL (PostgreSQL: always the asyncpg driver)
    label: str  # for messages: the path, or the URL without its password


def one_line(text: object) -> str:
    """Error text for a `LogError`: driver messages may span lines."""
    return " ".join(str(text).split())


def parse_target(target: str) -> Target:
    if not isinstance(target, str) or not target.strip():
        raise LogError(f"empty log target {target!r}: give a file path or a database URL")
    if "://" not in target:
        return _sqlite(target)
    try:
        url = make_url(target)
    except (ArgumentError, ValueError) as exc:
        raise LogError(f"{target}: not a valid database URL ({one_line(exc)})") from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            raise LogError(f"{target}: an SQLite log needs a file path (sqlite:///PATH)")
        return _sqlite(url.database)
    if backend in ("postgresql", "postgres"):
        return _postgres(url)
    raise LogError(
        f"{target}: unsupported log URL scheme {url.drivername!r}; "
        "use a file path, sqlite:///PATH or postgresql://..."
    )


def _sqlite(path: str) -> Target:
    path = os.path.expanduser(path)
    return Target("sqlite", path, f"sqlite:///{path}", path)


def _postgres(url: URL) -> Target:
    url = url.set(drivername="postgresql+asyncpg")
    text = url.render_as_string(hide_password=False)
    return Target("postgresql", "", text, url.render_as_string(hide_password=True))


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
