"""Which code wrote a log: `CODE_VERSION`, the release and a hash of the package's sources.

A run record's `code_version` said "0.1.0" whatever the tree held, so a log replayed after a
change could not tell a code change from nondeterminism (`replay verify` diverged with no hint).
Now it is `0.1.0+src.<12 hex digits>`: sha256 over the relative path and bytes of every `.py` file
of the packages that decide behaviour (tests, benchmarks and examples aside), in path order. Two
checkouts of one commit agree; the pure and compiled builds agree (one source). Computed once per
process (18 ms measured here)."""

from __future__ import annotations

import hashlib
from pathlib import Path

RELEASE = "0.1.0"
SOURCE_DIRS = ("core", "actors", "adapters", "persistence", "replay", "daemon", "cli")


def source_hash(root: Path | None = None) -> str:
    """The first 12 hex digits of the sources' sha256 (`root`: the package directory)."""
    root = root if root is not None else Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    files = sorted(p for d in SOURCE_DIRS for p in (root / d).rglob("*.py"))
    for path in files:
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:12]


CODE_VERSION = f"{RELEASE}+src.{source_hash()}"
