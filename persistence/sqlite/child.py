"""The SQLite log's child processes: the framing both sides speak, spawning, and the
two loops that run in a child — the log writer and the log reader.

A child runs this module (`python -P -m deepserve.persistence.sqlite.child ROLE
FD...`) and imports only the standard library, msgspec and the other stdlib-only
modules of the package (`errors`, `rows`, `sqlite.sql`), and zstandard: it is ready in ~70 ms,
without the ~250 ms that SQLAlchemy costs. The parent compiles the SQL and sends
it as the first frame (writer) or on stdin (reader). The parents' sides are
`process_writer.ProcessSink` and `process_reader.ReaderProcess`.

A frame, either way: an 8-byte little-endian length, then the payload; its first
byte says what it is.
- writer (`write DATA_FD ACK_FD`): parent to child CONFIG (msgpack map), RUN (a
  msgpack `RunRec`), PAGE (a `PAGE_HEAD`, then a msgpack `list[Step]`, stored
  zstd-compressed: one `pages` row, not decoded), each committed in one transaction, and
  SYNC (empty: "acknowledge what you have"), FINISH (empty, the last frame of a sink closed
  cleanly: store each run's closing record; a parent that dies sends none); child to parent ACK (frames, steps and
  transactions committed so far, three little-endian u64) or ERROR (one line, UTF-8),
  after which it exits. The writer acknowledges a RUN or a SYNC at once, PAGEs every
  `ack_every` frames (CONFIG), and everything at end of file: an acknowledgement per
  page woke the parent's reader thread for every page, and its handing the GIL back
  and forth with the driver cost the logged simulation ~15 % of its time (measured).
- reader (`read OUT_FD`, config on stdin): child to parent STEPS (a msgpack list of
  step tuples, at most `frame_bytes` unless one step is larger), END (the number of
  steps sent) or ERROR (msgpack `[OTHER | FROM_SQLITE | DAMAGED, one line]`; DAMAGED:
  a row failed its checksum), after which it exits.
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
import zlib
from typing import Any, BinaryIO

import msgspec
import zstandard

from ..errors import LogError, RunExists, one_line
from ..rows import DamagedRow, RunningDigest, run_row
from .sql import RUN_EXISTS, MultiInsert, read_steps, transaction

HEADER = struct.Struct("<Q")
ACK_BODY = struct.Struct("<QQQ")
PAGE_HEAD = struct.Struct("<Qdd")  # a PAGE's step count, least and greatest input time
CONFIG, RUN, STEPS, ACK, ERROR, END, PAGE, SYNC, FINISH = b"CRSAEZPYF"
# A page is stored as a zstd frame at this level (pages.py reads it back): zstd's fast levels
# make Mooncake pages ~4.5x smaller at ~700 MB/s (level 1: 4.9x at 430 MB/s; zlib's fastest:
# 3.4x at 90 MB/s; measured on a sim run's pages). Fewer bytes to store cost the writer less
# CPU than compressing them does (docs/decisions.md, "Pages are zstd frames").
PAGE_ZSTD_LEVEL = -1
PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged F_SETPIPE_SZ
OTHER, FROM_SQLITE, DAMAGED = 0, 1, 2  # what a reader's ERROR is (its first item)


# ---- framing and spawning (both sides) -------------------------------------------------
def read_frame(f: BinaryIO) -> bytes | None:
    """The next payload; None at end of file. A frame cut short by EOF (its sender was
    killed mid-write) counts as end of file: there is nothing usable in it."""
    head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (size,) = HEADER.unpack(head)
    body = f.read(size)
    return body if len(body) == size else None


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """os.write until everything is out (a pipe takes what fits, then blocks)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_all_parts(fd: int, head: bytes | bytearray, body: bytes | bytearray) -> None:
    """`write_all(fd, head + body)` without copying the body into a new buffer first."""
    done = os.writev(fd, (head, body))
    if done < len(head):
        write_all(fd, head[done:])
        done = len(head)
    if done - len(head) < len(body):
        write_all(fd, memoryview(body)[done - len(head) :])


def frame(kind: int, body: bytes) -> bytes:
    return HEADER.pack(len(body) + 1) + bytes((kind,)) + body


class FrameEncoder:
    """Encodes msgpack frames into one reused buffer (header, kind, payload)."""

    def __init__(self) -> None:
        self.buf = bytearray(HEADER.size + 1)
        self._encode_into = msgspec.msgpack.Encoder().encode_into

    def encode(self, kind: int, obj: Any, head: bytes = b"") -> bytearray:
        """The frame of `obj`, behind `head` (fixed-size fields of the kind) if given."""
        buf = self.buf
        start = HEADER.size + 1
        self._encode_into(obj, buf, start + len(head))
        HEADER.pack_into(buf, 0, len(buf) - HEADER.size)
        buf[HEADER.size] = kind
        buf[start : start + len(head)] = head
        return buf


def exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def spawn(role: str, *, stdin: bytes | None = None) -> tuple[subprocess.Popen[bytes], list[int]]:
    """Start a child in `role` ("write" or "read"): (process, the parent's pipe ends:
    for "write" [data write end, ack read end], for "read" [output read end]).
    fork+exec (subprocess) is safe with threads, and the child inherits only its own
    pipe ends: nothing else of ours keeps its input open or hides its exit. `stdin`,
    if given, is written to the child's stdin (a few hundred bytes: no blocking)."""
    if role == "write":
        data_r, data_w = os.pipe()
        ack_r, ack_w = os.pipe()
        deep, theirs, ours = data_w, [data_r, ack_w], [data_w, ack_r]
    else:
        out_r, out_w = os.pipe()
        deep, theirs, ours = out_w, [out_w], [out_r]
    with contextlib.suppress(ImportError, AttributeError, OSError):
        import fcntl  # a deeper pipe (Linux): the sender runs a few frames ahead

        fcntl.fcntl(deep, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[attr-defined]
    argv = [sys.executable, "-P", "-m", __name__, role, *map(str, theirs)]
    try:
        proc = subprocess.Popen(
            argv,
            pass_fds=theirs,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        )
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    if stdin is not None and proc.stdin is not None:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except OSError:
            pass  # it died at once: the parent reads end of file and reports it
    return proc, ours


# ---- the writer process ----------------------------------------------------------------
class PageWriter:
    """Commits RUN and PAGE payloads, one transaction each. A page is stored as a zstd
    frame of the bytes it came in (`pages.py`): this process never decodes a step."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.conn = sqlite3.connect(cfg["path"], isolation_level=None, timeout=cfg["timeout"])
        for pragma in cfg["pragmas"]:
            self.conn.execute(f"PRAGMA {pragma}")
        max_vars = self.conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self.runs = MultiInsert(cfg["runs_sql"], cfg["runs_cols"], max_vars)
        self.page_sql: str = cfg["page_sql"]
        self.max_id: str = cfg["max_id_sql"]
        self.run_id_index: int = cfg["run_id_index"]
        self.process_index: int = cfg["process_index"]
        self.label: str = cfg["label"]
        self.end_sql: str = cfg["end_sql"]
        self.run_id: str | None = None
        self.ends: dict[tuple[str, str], RunningDigest] = {}  # the closing records' sums
        self.digest = RunningDigest()  # the current run's (replaced by each RUN)
        self.decode = msgspec.msgpack.Decoder().decode
        self.compress = zstandard.ZstdCompressor(level=PAGE_ZSTD_LEVEL).compress

    def write(self, payload: bytes) -> int:
        """Commit one payload (a SYNC: nothing to commit); returns how many steps it held."""
        kind = payload[0]
        if kind == SYNC:
            return 0
        if kind == RUN:
            run = self.decode(memoryview(payload)[1:])
            transaction(self.conn, lambda c: self._run(c, run))
            self.run_id = run[self.run_id_index]
            self.digest = self.ends[(self.run_id, run[self.process_index])] = RunningDigest()
            return 0
        if kind == FINISH:
            rows = [d.end_row(run_id, process) for (run_id, process), d in self.ends.items()]
            transaction(self.conn, lambda c: c.executemany(self.end_sql, rows))
            return 0
        if kind != PAGE:
            raise ValueError(f"unknown frame kind {kind!r}")
        if self.run_id is None:
            raise ValueError("a step was appended before begin_run()")
        steps, t_first, t_last = PAGE_HEAD.unpack_from(payload, 1)
        body = memoryview(payload)[1 + PAGE_HEAD.size :]
        transaction(self.conn, lambda c: self._page(c, steps, t_first, t_last, body))
        return steps

    def _run(self, c: sqlite3.Connection, run: list[Any]) -> None:
        key = (run[self.run_id_index], run[self.process_index])
        if c.execute(RUN_EXISTS, key).fetchone() is not None:
            raise RunExists(self.label, *key)
        self.runs.run_flat(c, run_row(run))

    def _page(
        self, c: sqlite3.Connection, steps: int, t_first: float, t_last: float, body: memoryview
    ) -> None:
        # Step ids are assigned under the write lock, as in `SqliteBatchStore`.
        first = (c.execute(self.max_id).fetchone()[0] or 0) + 1
        stored = self.compress(body)
        crc = zlib.crc32(stored)
        c.execute(self.page_sql, (self.run_id, first, steps, t_first, t_last, stored, crc))
        self.digest.add((crc,), steps)  # a failed transaction fails the writer: no closing record

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

    def ack(self, frames: int, steps: int, transactions: int) -> None:
        self.send(ACK, ACK_BODY.pack(frames, steps, transactions))

    def error(self, text: str) -> None:
        self.send(ERROR, one_line(text).encode("utf-8", "replace"))


def serve_writer(src: BinaryIO, acks: Acks) -> int:
    """Until end of file: commit each frame; acknowledge as the module docstring says.
    Returns the exit code."""
    head = read_frame(src)
    if head is None or head[0] != CONFIG:
        return 0  # the parent gave up before configuring us
    cfg = msgspec.msgpack.decode(memoryview(head)[1:])
    label = cfg["label"]
    try:
        writer = PageWriter(cfg)
    except Exception as exc:
        acks.error(f"{label}: cannot open the log: {type(exc).__name__}: {exc}")
        return 1
    # The loop makes no reference cycles (decoded lists, ints, strings), so reference
    # counting frees everything; the cyclic collector would only re-scan each batch's
    # fresh containers, which costs more than the decoding itself.
    gc.freeze()
    gc.disable()
    ack_every = cfg.get("ack_every", 1)
    frames = steps = transactions = acked = 0
    try:
        while (payload := read_frame(src)) is not None:
            steps += writer.write(payload)
            frames += 1
            if payload[0] != SYNC and payload[0] != FINISH:  # (a FINISH: not counted, as before)
                transactions += 1
            if payload[0] != PAGE or frames - acked >= ack_every:
                acks.ack(frames, steps, transactions)
                acked = frames
        if frames > acked:  # end of file: the parent is closing and waits for this
            acks.ack(frames, steps, transactions)
    except LogError as exc:  # one line for the user as it is (a refused run)
        acks.error(str(exc))
        return 1
    except Exception as exc:
        acks.error(f"{label}: log writer failed: {type(exc).__name__}: {exc}")
        return 1
    finally:
        writer.close()
    return 0


# ---- the reader process ----------------------------------------------------------------
def send_steps(fd: int, enc: FrameEncoder, groups: list[tuple], limit: int) -> None:
    """One STEPS frame, or halves of it until each fits `limit` (huge payloads)."""
    buf = enc.encode(STEPS, groups)
    if len(buf) > limit and len(groups) > 1:
        half = len(groups) // 2
        send_steps(fd, enc, groups[:half], limit)
        send_steps(fd, enc, groups[half:], limit)
        return
    write_all(fd, buf)


def serve_reader(cfg: dict[str, Any], fd: int) -> int:
    """Stream the configured query's steps to `fd`; returns the exit code."""
    # Only lists, tuples and scalars, freed by reference counting: the cyclic
    # collector would just re-scan every fetched row.
    gc.disable()
    enc = FrameEncoder()
    try:
        conn = sqlite3.connect(cfg["uri"], timeout=cfg["timeout"], uri=True)  # read-only
        try:
            conn.execute("PRAGMA query_only=1")
            sent = 0
            for chunk in read_steps(conn, cfg["sql"], cfg["params"], cfg["kids"], cfg["size"]):
                send_steps(fd, enc, chunk, cfg["frame_bytes"])
                sent += len(chunk)
            write_all(fd, enc.encode(END, sent))
        finally:
            conn.close()
    except BrokenPipeError:
        return 0  # the parent stopped reading: nobody to tell
    except Exception as exc:  # noqa: BLE001 — every failure goes to the parent as one line
        with contextlib.suppress(OSError):
            text = one_line(exc) or type(exc).__name__
            kind = DAMAGED if isinstance(exc, DamagedRow) else int(isinstance(exc, sqlite3.Error))
            write_all(fd, enc.encode(ERROR, [kind, text]))
        return 1
    return 0


def main(argv: list[str]) -> int:
    # Ctrl-C reaches the whole process group: the parent decides what happens, and a
    # writer must still commit everything it was sent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    role, fds = argv[1], [int(a) for a in argv[2:]]
    if role == "write":
        with open(fds[0], "rb", buffering=1 << 20) as src:
            code = serve_writer(src, Acks(fds[1]))
        # Everything is committed and the log closed: skip the interpreter's teardown,
        # which the parent's `close()` would otherwise wait for (~10 ms, measured).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raw = sys.stdin.buffer.read()
    if not raw:
        return 0  # the parent gave up before configuring us
    return serve_reader(msgspec.msgpack.decode(raw), fds[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
