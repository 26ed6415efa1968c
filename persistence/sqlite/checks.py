"""Cheap checks of an SQLite file, from its header and size alone (standard library only:
the writer's side of a log, `fresh.py`, is created without SQLAlchemy)."""

from __future__ import annotations

import os
import stat

from ..errors import LogError

BUSY_MS = 10_000  # wait this long for another connection's write lock
SQLITE_MAGIC = b"SQLite format 3\x00"
_HEADER = 100
NO_FILE = "no such file or directory"
EMPTY_FILE = "empty file (0 bytes), not a deepserve log"


def _be_int(data: bytes) -> int:
    return int.from_bytes(data, "big")


# Header fields with fixed or few legal values (sqlite.org/fileformat2.html, "The Database
# Header"): a byte changed there is a corrupt header, which SQLite reports only as "file is not
# a database" or "malformed" (read as "truncated" before: a wrong word for evidence).
_FIXED: tuple[tuple[int, int, str, tuple[int, ...]], ...] = (
    (18, 1, "file format write version", (1, 2)),
    (19, 1, "file format read version", (1, 2)),
    (21, 1, "maximum embedded payload fraction", (64,)),
    (22, 1, "minimum embedded payload fraction", (32,)),
    (23, 1, "leaf payload fraction", (32,)),
    (44, 4, "schema format number", (0, 1, 2, 3, 4)),
    (56, 4, "text encoding", (0, 1, 2, 3)),
)


def _fixed_field_problem(header: bytes) -> str | None:
    for offset, width, name, legal in _FIXED:
        value = _be_int(header[offset : offset + width])
        if value not in legal:
            return f"corrupt SQLite header: {name} (byte {offset}) is {value}, not {' or '.join(map(str, legal))}"
    if any(header[72:92]):
        return "corrupt SQLite header: its reserved bytes 72-91 are not zero"
    return None


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
        return f"corrupt SQLite header: page size {page_size} (byte 16) is not a power of two from 512 to 65536"
    fixed = _fixed_field_problem(header)
    if fixed:
        return fixed
    if has_wal:
        # A live or crashed writer: pages may still be in the -wal file, so the main
        # file's size says nothing yet; SQLite recovers it on open.
        return None
    pages = _be_int(header[28:32])
    header_valid = pages > 0 and header[24:28] == header[92:96]
    expected = pages * page_size
    if header_valid and size < expected:
        if size % page_size == 0:  # whole pages: a cut at a page boundary, or a changed count
            return (f"truncated: {size} bytes ({size // page_size} whole pages), but its header says "
                    f"{pages} pages of {page_size} bytes (or its page count, byte 28, is corrupt)")
        return f"truncated: {size} bytes, but its header says {pages} pages of {page_size} bytes"
    if size % page_size:
        return f"truncated: {size} bytes is not a whole number of {page_size}-byte pages"
    return None


def sqlite_file_problem(path: str) -> str | None:
    """None if `path` looks like a whole SQLite file; else one line saying why not."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return NO_FILE
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    if stat.S_ISDIR(mode):
        return "is a directory"
    if not stat.S_ISREG(mode):  # opening a FIFO to read its header would wait for a writer
        return f"not a regular file ({_file_kind(mode)}), not a deepserve log"
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header = f.read(_HEADER)
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    wal = path + "-wal"
    has_wal = os.path.exists(wal) and os.path.getsize(wal) > 0
    return header_problem(header, size, has_wal)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a file")


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
