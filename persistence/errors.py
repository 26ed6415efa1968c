"""`LogError` and its one-line text. Standard library only: the child processes
(`sqlite/child.py`) import this too, and must start without SQLAlchemy."""

from __future__ import annotations


class LogError(Exception):
    """A log that cannot be read or written: corrupt, truncated, wrong schema version,
    a failed writer. The message is one precise line meant for the user."""


def one_line(text: object) -> str:
    """Error text for a `LogError`: driver and database messages may span lines."""
    return " ".join(str(text).split())


class RunExists(LogError):
    """A run begun in a log that already holds a run with its id and process: run ids
    are unique per log (per process of a daemon run sharing one database)."""

    def __init__(self, label: str, run_id: str, process: str) -> None:
        super().__init__(
            f"{label}: run {run_id!r} (process {process!r}) is already in this log; "
            "give the run another id, or use another log"
        )
