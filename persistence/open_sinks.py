"""Every log sink open in this process, so that none is left unwritten — or fails
unheard — at exit.

A writer is a daemon thread or a child process: neither may keep a crashed program
alive, so a sink still open when the interpreter exits is closed here (its queue is
written first). A close that fails then — the log's last writes are lost — is
reported on stderr through structlog (the application's structlog configuration if
it has one) and kept in `close_failures()`. A program that owns its exit status (the
`deepserve` CLI) calls `close_open_sinks()` itself before it returns, and exits
non-zero if that returns anything: by the time `atexit` runs, the status is fixed.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from typing import Any, Protocol

import structlog

from .errors import LogError


class _Closable(Protocol):
    label: str

    def close(self) -> None: ...


_open: weakref.WeakSet[Any] = weakref.WeakSet()
_failures: list[str] = []
_lock = threading.Lock()


def track(sink: _Closable) -> None:
    with _lock:
        _open.add(sink)


def untrack(sink: _Closable) -> None:
    with _lock:
        _open.discard(sink)


def tracked() -> list[Any]:
    with _lock:
        return list(_open)


def close_open_sinks() -> list[str]:
    """Close every sink still open in this process; returns the one-line `LogError`
    of each close that failed (also reported, and added to `close_failures()`)."""
    failed = []
    for sink in tracked():
        try:
            sink.close()
        except LogError as exc:
            failed.append(str(exc))
            _report(sink, str(exc))
    return failed


def close_failures() -> list[str]:
    """Every failure `close_open_sinks` met in this process so far (at exit too)."""
    with _lock:
        return list(_failures)


def _report(sink: _Closable, error: str) -> None:
    with _lock:
        _failures.append(error)
    _logger().error("log sink failed at close: its last writes are lost", log=sink.label, error=error)


def _logger() -> Any:
    if structlog.is_configured():
        return structlog.get_logger("deepserve.persistence")
    # structlog's default prints to stdout, which is the program's output: not there
    return structlog.wrap_logger(structlog.PrintLogger(sys.stderr))


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(close_open_sinks)
