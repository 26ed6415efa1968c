"""Reading steps from an SQLite log with plain sqlite3, in-process or as the log reader
process that streams them to its parent (see `sqlite_reader`).

`read_groups` is the one reading loop both use: input rows come `size` at a time from
one cursor; the events, outputs and snapshots of exactly those steps follow, one query
per table and chunk; each step becomes `(input row, [event rows], [output rows],
snapshot row or None)`. Every row carries its step id as its *last* column: `Step`
and its records are array-like structs, and msgspec ignores trailing array items
when it builds one, so the nested tuples convert (in-process, `msgspec.convert`) or
encode and decode (through the pipe) into a `Step` with no per-row slicing. Booleans
come back from SQLite as 0/1: both sides use msgspec's lax mode, which takes them.

This file also runs as a script (`python -P readproc.py OUT_FD`, config on stdin), so
it imports only the standard library and msgspec (as `logproc` does: the process is
ready in ~40 ms). Frames to the parent: an 8-byte little-endian length, then the
payload, whose first byte says what it is: STEPS (a msgpack list of step tuples, at
most FRAME_BYTES unless one step is larger), END (the number of steps sent), ERROR
(msgpack `[from_sqlite, one line]`), after which the process exits.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sqlite3
import struct
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

HEADER = struct.Struct("<Q")
STEPS, END, ERROR = b"SZE"
PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged F_SETPIPE_SZ
FRAME_BYTES = 1 << 20
MAX_IN = 512  # ids in one IN (...): within SQLite's historical 999-variable limit

Row = Sequence[Any]


def group_steps(ins: list[Row], evs: list[Row], outs: list[Row], snaps: list[Row]) -> list[tuple]:
    """Step tuples from rows whose last column is the step id; child rows ordered by
    step id then insertion. Child rows of steps not in `ins` (a dense range fetch
    under a filter) are never looked up."""
    by_ev: dict[int, list[Row]] = {}
    for r in evs:
        got = by_ev.get(r[-1])
        if got is None:
            by_ev[r[-1]] = [r]
        else:
            got.append(r)
    by_out: dict[int, list[Row]] = {}
    for r in outs:
        got = by_out.get(r[-1])
        if got is None:
            by_out[r[-1]] = [r]
        else:
            got.append(r)
    by_snap: dict[int, Row] = {}
    for r in snaps:
        by_snap.setdefault(r[-1], r)
    none: list[Row] = []  # shared: converting or encoding never mutates it
    ev, out, snap = by_ev.get, by_out.get, by_snap.get
    return [(r, ev(r[-1], none), out(r[-1], none), snap(r[-1])) for r in ins]


class Children:
    """The queries for one child table: `head` is `SELECT <fields>, step_id FROM t`."""

    def __init__(self, head: str) -> None:
        self.dense = f"{head} WHERE step_id BETWEEN ? AND ? ORDER BY step_id, id"
        self._head = head
        self._in: dict[int, str] = {}

    def fetch(self, conn: sqlite3.Connection, ids: list[int]) -> list[Row]:
        """Rows of the steps `ids` (ascending): one index range scan when they are most
        of their range, else IN lists padded to a power of two (few distinct
        statements, so sqlite3's statement cache prepares each once)."""
        if ids[-1] - ids[0] < 2 * len(ids):
            return conn.execute(self.dense, (ids[0], ids[-1])).fetchall()
        rows: list[Row] = []
        for i in range(0, len(ids), MAX_IN):
            part = ids[i : i + MAX_IN]
            n = 1 << (len(part) - 1).bit_length()
            part += [part[-1]] * (n - len(part))
            rows += conn.execute(self._in_sql(n), part).fetchall()
        return rows

    def _in_sql(self, n: int) -> str:
        sql = self._in.get(n)
        if sql is None:
            marks = ",".join("?" * n)
            sql = self._in[n] = f"{self._head} WHERE step_id IN ({marks}) ORDER BY step_id, id"
        return sql


def read_groups(
    conn: sqlite3.Connection, sql: str, params: Sequence[Any], heads: Sequence[str], size: int
) -> Iterator[list[tuple]]:
    """Step tuples of the input query `sql` (its rows end with the step id, in id
    order), `size` steps at a time. The open cursor keeps one read transaction, so
    the child queries see the same snapshot as the inputs."""
    kids = [Children(h) for h in heads]
    cur = conn.execute(sql, params)
    try:
        while ins := cur.fetchmany(size):
            ids = [r[-1] for r in ins]
            yield group_steps(ins, *(k.fetch(conn, ids) for k in kids))
    finally:
        with contextlib.suppress(sqlite3.ProgrammingError):  # the log was closed first
            cur.close()


# ---- the process ----------------------------------------------------------------------
def write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Frames:
    """Encodes frames into one reused buffer and writes them to the parent's pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray(HEADER.size + 1)
        self._encode_into = msgspec.msgpack.Encoder().encode_into

    def send(self, kind: int, obj: Any) -> None:
        self._encode_into(obj, self._buf, HEADER.size + 1)
        self._write(kind)

    def send_steps(self, groups: list[tuple], limit: int) -> None:
        """One frame, or halves of it until each fits `limit` (huge payloads)."""
        self._encode_into(groups, self._buf, HEADER.size + 1)
        if len(self._buf) > limit and len(groups) > 1:
            half = len(groups) // 2
            self.send_steps(groups[:half], limit)
            self.send_steps(groups[half:], limit)
            return
        self._write(STEPS)

    def _write(self, kind: int) -> None:
        buf = self._buf
        HEADER.pack_into(buf, 0, len(buf) - HEADER.size)
        buf[HEADER.size] = kind
        write_all(self.fd, buf)


def serve(cfg: dict[str, Any], frames: Frames) -> int:
    """Stream the configured query's steps; returns the exit code."""
    # Only lists, tuples and scalars, freed by reference counting: the cyclic
    # collector would just re-scan every fetched row.
    gc.disable()
    try:
        conn = sqlite3.connect(os.fsdecode(cfg["path"]), timeout=cfg["timeout"])
        try:
            conn.execute("PRAGMA query_only=1")
            sent = 0
            groups = read_groups(conn, cfg["sql"], cfg["params"], cfg["kids"], cfg["size"])
            for chunk in groups:
                frames.send_steps(chunk, cfg["frame_bytes"])
                sent += len(chunk)
            frames.send(END, sent)
        finally:
            conn.close()
    except BrokenPipeError:
        return 0  # the parent stopped reading: nobody to tell
    except Exception as exc:  # noqa: BLE001 — every failure goes to the parent as one line
        text = " ".join(str(exc).split()) or type(exc).__name__
        with contextlib.suppress(OSError):
            frames.send(ERROR, [isinstance(exc, sqlite3.Error), text])
        return 1
    return 0


def spawn(cfg: dict[str, Any]) -> tuple[subprocess.Popen[bytes], int]:
    """Run this file as a reader: (process, read end of its output pipe). The child
    inherits only the write end; the config goes over its stdin."""
    out_r, out_w = os.pipe()
    with contextlib.suppress(ImportError, AttributeError, OSError):
        import fcntl  # a deeper pipe (Linux): the reader runs a few frames ahead

        fcntl.fcntl(out_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[attr-defined]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-P", __file__, str(out_w)],
            pass_fds=(out_w,),
            stdin=subprocess.PIPE,
        )
    except BaseException:
        os.close(out_r)
        raise
    finally:
        os.close(out_w)
    assert proc.stdin is not None
    try:  # a few hundred bytes: the pipe takes them without blocking
        proc.stdin.write(msgspec.msgpack.encode(cfg))
        proc.stdin.close()
    except OSError:
        pass  # it died at once: the parent reads end of file and reports it
    return proc, out_r


def main(argv: list[str]) -> int:
    # Ctrl-C reaches the whole process group: the parent decides, and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    frames = Frames(int(argv[1]))
    raw = sys.stdin.buffer.read()
    if not raw:
        return 0  # the parent gave up before configuring us
    return serve(msgspec.msgpack.decode(raw), frames)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
