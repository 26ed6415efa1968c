"""The log writer process: reads encoded batches of steps from a pipe and commits each
to one SQLite file in one transaction, acknowledging as it goes (see `procsink`).

This file runs as a script (`python -P logproc.py DATA_FD ACK_FD`), outside the
package: it imports only the standard library and msgspec, so the process is ready in
~40 ms instead of the ~250 ms that importing `deepserve.persistence` (SQLAlchemy)
takes. The parent compiles the SQL and sends it in the first frame. The parent's
side imports from here too: `procsink` the framing and `spawn`, `sqlite_writer` the
multi-row INSERTs.

Frames, both ways: an 8-byte little-endian length, then the payload; its first byte
says what it is. Parent to writer: CONFIG (msgpack map), RUN (a msgpack `RunRec`),
STEPS (a msgpack `list[Step]`). Writer to parent: ACK (frames and steps committed so
far, two little-endian u64), ERROR (one line, UTF-8), after which the writer exits.
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
from typing import Any, BinaryIO

import msgspec

HEADER = struct.Struct("<Q")
ACK_BODY = struct.Struct("<QQ")
CONFIG, RUN, STEPS, ACK, ERROR = b"CRSAE"
PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged F_SETPIPE_SZ


def read_frame(f: BinaryIO) -> bytes | None:
    """The next payload; None at end of file. A frame cut short by EOF (its sender was
    killed mid-write) counts as end of file: there is nothing usable in it."""
    head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    body = f.read(size)
    return body if len(body) == size else None


def write_all(fd: int, data: bytes | bytearray) -> None:
    """os.write until everything is out (a pipe takes what fits, then blocks)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def frame(kind: int, body: bytes) -> bytes:
    return HEADER.pack(len(body) + 1) + bytes((kind,)) + body


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def chunk_sizes(n: int, top: int) -> list[int]:
    """Split n rows into chunks of `top` rows, then powers of two: few distinct
    statement shapes, so sqlite3's statement cache prepares each only once."""
    sizes = [top] * (n // top)
    rest = n % top
    bit = top
    while rest:
        bit >>= 1
        if rest >= bit:
            sizes.append(bit)
            rest -= bit
    return sizes


class MultiInsert:
    """INSERTs of many rows per statement for one table."""

    def __init__(self, one_row_sql: str, ncols: int, max_vars: int) -> None:
        self._head, self._values = one_row_sql.split(" VALUES ", 1)
        self.ncols = ncols
        top = 1
        while top * 2 * ncols <= max_vars:
            top *= 2
        self.top = top  # rows per full statement, a power of two
        self._sql: dict[int, str] = {}

    def sql(self, rows: int) -> str:
        text = self._sql.get(rows)
        if text is None:
            text = self._sql[rows] = f"{self._head} VALUES {','.join([self._values] * rows)}"
        return text

    def run_flat(self, conn: sqlite3.Connection, params: list[Any]) -> None:
        """`params`: the rows' values one after another (`ncols` per row)."""
        n = self.ncols
        rows = len(params) // n
        if rows * n != len(params):  # a record of another shape would shift every column
            raise ValueError(f"{len(params)} values do not make rows of {n} columns")
        pos = 0
        for size in chunk_sizes(rows, self.top):
            part = params if size == rows else params[pos * n : (pos + size) * n]
            conn.execute(self.sql(size), part)
            pos += size


def flat_rows(steps: list[Any], run_id: str, sid: int) -> tuple[list, list, list, list]:
    """INSERT parameters for the inputs, events, outputs and snapshots of decoded steps.

    A step decodes as `[input, events, outputs, snapshot]` (array-like structs become
    lists of their field values); each row is `[step id, run id, *fields]`, the order
    of `schema.INSERT_COLUMNS`. Building one flat list per table skips the per-row
    tuples of `rows.batch_rows`: this loop is the writer process's own CPU budget."""
    ins: list[Any] = []
    evs: list[Any] = []
    outs: list[Any] = []
    snaps: list[Any] = []
    for inp, events, outputs, snap in steps:
        ins.append(sid)
        ins.append(run_id)
        ins += inp
        for e in events:
            evs.append(sid)
            evs.append(run_id)
            evs += e
        for o in outputs:
            outs.append(sid)
            outs.append(run_id)
            outs += o
        if snap is not None:
            snaps.append(sid)
            snaps.append(run_id)
            snaps += snap
        sid += 1
    return ins, evs, outs, snaps


def fast_binding() -> None:
    """sqlite3 binds int, float, str and bytearray directly, but for None, bool and
    bytes it first looks for an adapter: a registry miss, then attribute lookups that
    build and discard an AttributeError (~0.3 µs a value, ten values a step). With an
    adapter registered it is a dict hit and a C call. The values stored do not change
    (NULL, integer 0/1, blob). Process-wide, which is why only the writer does it."""
    sqlite3.register_adapter(type(None), {}.get)  # None -> None, in C
    sqlite3.register_adapter(bool, int)
    sqlite3.register_adapter(bytes, bytes)  # returns its argument unchanged


class FlatWriter:
    """Commits RUN and STEPS payloads, one transaction each."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.conn = sqlite3.connect(cfg["path"], isolation_level=None, timeout=cfg["timeout"])
        for pragma in cfg["pragmas"]:
            self.conn.execute(f"PRAGMA {pragma}")
        max_vars = self.conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self.runs = MultiInsert(cfg["runs_sql"], cfg["runs_cols"], max_vars)
        # inputs, events, outputs, snapshots: the order of `flat_rows`
        self.tables = [MultiInsert(sql, n, max_vars) for sql, n in cfg["step_tables"]]
        self.max_id: str = cfg["max_id_sql"]
        self.run_id_index: int = cfg["run_id_index"]
        self.run_id: str | None = None
        self.decode = msgspec.msgpack.Decoder().decode

    def write(self, payload: bytes) -> int:
        """Commit one payload; returns how many steps it held."""
        kind, body = payload[0], memoryview(payload)[1:]
        if kind == RUN:
            run = self.decode(body)
            self._transaction(lambda c: self.runs.run_flat(c, run))
            self.run_id = run[self.run_id_index]
            return 0
        if kind != STEPS:
            raise ValueError(f"unknown frame kind {kind!r}")
        steps = self.decode(body)
        if self.run_id is None:
            raise ValueError("a step was appended before begin_run()")
        self._transaction(lambda c: self._steps(c, steps))
        return len(steps)

    def _steps(self, c: sqlite3.Connection, steps: list[Any]) -> None:
        # Step ids are assigned here, under the write lock, as in `SqliteBatchStore`.
        base = c.execute(self.max_id).fetchone()[0] or 0
        rows = flat_rows(steps, self.run_id, base + 1)  # type: ignore[arg-type]
        for table, params in zip(self.tables, rows, strict=True):
            if params:
                table.run_flat(c, params)

    def _transaction(self, body: Any) -> None:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            body(c)
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.conn.close()


class Acks:
    """The writer's side of the acknowledgement pipe. Once the parent is gone (EPIPE)
    acks are dropped, but writing goes on: everything received is still committed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.gone = False

    def send(self, kind: int, body: bytes) -> None:
        if not self.gone:
            try:
                write_all(self.fd, frame(kind, body))
            except OSError:
                self.gone = True

    def ack(self, frames: int, steps: int) -> None:
        self.send(ACK, ACK_BODY.pack(frames, steps))

    def error(self, text: str) -> None:
        self.send(ERROR, one_line(text).encode("utf-8", "replace"))


def serve(src: BinaryIO, acks: Acks) -> int:
    """Until end of file: commit each frame, then acknowledge it. Returns the exit code."""
    head = read_frame(src)
    if head is None or head[0] != CONFIG:
        return 0  # the parent gave up before configuring us
    cfg = msgspec.msgpack.decode(memoryview(head)[1:])
    label = cfg["label"]
    try:
        writer = FlatWriter(cfg)
    except Exception as exc:
        acks.error(f"{label}: cannot open the log: {type(exc).__name__}: {exc}")
        return 1
    fast_binding()
    # The loop makes no reference cycles (decoded lists, ints, strings), so reference
    # counting frees everything; the cyclic collector would only re-scan each batch's
    # fresh containers, which costs more than the decoding itself.
    gc.freeze()
    gc.disable()
    frames = steps = 0
    try:
        while (payload := read_frame(src)) is not None:
            steps += writer.write(payload)
            frames += 1
            acks.ack(frames, steps)
    except Exception as exc:
        acks.error(f"{label}: log writer failed: {type(exc).__name__}: {exc}")
        return 1
    finally:
        writer.close()
    return 0


def spawn() -> tuple[subprocess.Popen[bytes], int, int]:
    """Run this file as the writer: (process, data pipe's write end, ack pipe's read
    end). fork+exec (subprocess) is safe with threads, and the child inherits only
    its two pipe ends: nothing else of ours keeps its input open or hides its exit."""
    data_r, data_w = os.pipe()
    ack_r, ack_w = os.pipe()
    with contextlib.suppress(ImportError, AttributeError, OSError):
        import fcntl  # a deeper pipe (Linux): the driver can run a few batches ahead

        fcntl.fcntl(data_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[attr-defined]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-P", __file__, str(data_r), str(ack_w)],
            pass_fds=(data_r, ack_w),
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        os.close(data_w)
        os.close(ack_r)
        raise
    finally:
        os.close(data_r)
        os.close(ack_w)
    return proc, data_w, ack_r


def exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def main(argv: list[str]) -> int:
    # Ctrl-C reaches the whole process group; the driver decides what happens and
    # closes the pipe, and everything it sent must still be written.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    data_fd, ack_fd = int(argv[1]), int(argv[2])
    with open(data_fd, "rb", buffering=1 << 20) as src:
        return serve(src, Acks(ack_fd))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
