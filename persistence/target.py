"""Where a log lives: parsing a target string.

A target is a plain path (SQLite; a directory means one file per process), an
`sqlite:///PATH` URL, or a `postgresql://` / `postgresql+asyncpg://` URL.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from .errors import LogError, one_line

if TYPE_CHECKING:
    from sqlalchemy.engine import URL


class Target(NamedTuple):
    kind: str  # "sqlite" | "postgresql"
    path: str  # SQLite file or directory ("" for PostgreSQL)
    url: str  # SQLAlchemy URL (PostgreSQL: always the asyncpg driver)
    label: str  # for messages: the path, or the URL without its password


def parse_target(target: str) -> Target:
    if not isinstance(target, str) or not target.strip():
        raise LogError(f"empty log target {target!r}: give a file path or a database URL")
    if "://" not in target:
        return _sqlite(target)  # a plain path: no SQLAlchemy (fresh.py says why)
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

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
