"""`ReaderProcess`: the parent's side of the log reader process (`child.py`, "read").

The child runs one query's SQLite reading on the other core and streams msgpack
frames of step tuples through a pipe; here each frame becomes a `list[Step]` in one
`Decoder.decode` call (~0.8 µs a step, against ~5 µs to fetch and build it). The pipe
holds at most ~1 MiB, so a few frames are in flight and the child blocks until the
consumer catches up: memory stays bounded whatever the log's length.

A process is stopped (closed pipe, then SIGKILL: it only reads) when its consumer is
done, abandons the iterator, closes the log, or the interpreter exits. If the parent
dies, the child's next write fails (EPIPE) and it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sqlite3
import subprocess
import weakref
from collections.abc import Iterator
from typing import Any

import msgspec

from deepserve.core.records import Step

from ..errors import LogError
from ..sql_reader import record_error
from . import child
from .child import DAMAGED, END, ERROR, FROM_SQLITE, HEADER, PIPE_BYTES, STEPS, exit_text
from .files import sqlite_error

# strict=False: SQLite hands booleans back as 0/1 (see `rows.group_steps`)
_DECODER = msgspec.msgpack.Decoder(list[Step], strict=False)
FRAME_BYTES = 1 << 20  # a frame's size the reader process aims at


class ReaderProcess:
    """One child process streaming the steps of one query (see the module docstring).
    `spawn` raises OSError when no process can be started."""

    def __init__(self, label: str, cfg: dict[str, Any]) -> None:
        self.label = label
        self._proc, (fd,) = child.spawn("read", stdin=msgspec.msgpack.encode(cfg))
        self._src = open(fd, "rb", buffering=PIPE_BYTES)  # noqa: SIM115 — closed in stop()
        self._owner = os.getpid()
        self._head = bytearray(HEADER.size)
        self._buf = bytearray(1 << 16)
        self._stopped = False
        _live.add(self)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def steps(self) -> Iterator[Step]:
        """The query's steps, in order. Does not stop the process: the caller does,
        in a `finally`, so that an abandoned iterator releases it too."""
        decode = _DECODER.decode
        while (frame := self._frame()) is not None:
            kind, body = frame[0], frame[1:]
            if kind == STEPS:
                try:
                    steps = decode(body)
                except msgspec.ValidationError as exc:
                    raise record_error(self.label, exc) from None
                yield from steps
            elif kind == END:
                self._proc.wait()
                return
            elif kind == ERROR:
                what, text = msgspec.msgpack.decode(body)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(5)  # it exits right after: let it, rather than kill it
                if what == FROM_SQLITE:
                    raise sqlite_error(self.label, sqlite3.DatabaseError(text))
                if what == DAMAGED:
                    raise LogError(f"{self.label}: {text}")
                raise LogError(f"{self.label}: the log reader process failed: {text}")
            else:
                raise LogError(f"{self.label}: the log reader process sent frame kind {kind}")
        if self._stopped:
            raise LogError(f"{self.label}: the log is closed")
        code = self._proc.wait()
        raise LogError(
            f"{self.label}: the log reader process exited unexpectedly ({exit_text(code)})"
        )

    def _frame(self) -> memoryview | None:
        """The next frame's payload (a view into a reused buffer: decode it before the
        next call); None at end of file, or when a frame is cut short by it."""
        if self._stopped or not self._fill(memoryview(self._head)):
            return None
        (size,) = HEADER.unpack(self._head)
        if size > len(self._buf):
            self._buf = bytearray(size)  # a fresh buffer: views of the old one may live on
        view = memoryview(self._buf)[:size]
        return view if self._fill(view) else None

    def _fill(self, view: memoryview) -> bool:
        readinto = self._src.readinto  # type: ignore[attr-defined]  # a buffered reader
        got = 0
        while got < len(view):
            n = readinto(view[got:])
            if not n:
                return False
            got += n
        return True

    def stop(self) -> None:
        """Release the process and the pipe. Idempotent; a no-op in a forked child
        (the process belongs to the parent)."""
        if self._stopped or os.getpid() != self._owner:
            return
        self._stopped = True
        _live.discard(self)
        self._src.close()  # a write in progress fails with EPIPE
        if self._proc.poll() is None:
            self._proc.kill()  # it might be inside a long query: don't wait for a write
        self._proc.wait()


_live: weakref.WeakSet[ReaderProcess] = weakref.WeakSet()


def live_readers() -> int:
    return len(_live)


@atexit.register
def _stop_live_readers() -> None:
    for reader in list(_live):
        reader.stop()
