"""`LogError` and its one-line text. Standard library only: the child processes
(`sqlite/child.py`) import this too, and must start without SQLAlchemy."""

from __future__ import annotations


class LogError(Exception):
    """A log that cannot be read or written: corrupt, truncated, wrong schema version,
    a failed writer. The message is one precise line meant for the user."""


def one_line(text: object) -> str:
    """Error text for a `LogError`: driver and database messages may span lines."""
    return " ".join(str(text).split())
