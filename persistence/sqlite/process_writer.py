"""`ProcessSink`: the `async` SQLite log writer in a child process.

The thread writer (`GroupCommitSink`) builds rows and binds them to SQLite while
holding the GIL, ~6 µs a step that the simulation cannot use, so a logged SimDriver
runs on one core. Here the driver only buffers steps (`append`; `SimDriver` hands over pages
it encoded itself, `append_page`) and, every `max_batch` of them, encodes the
batch with msgpack and writes it to a pipe as one page (`pages.py`); the writer process
(`child.py`, "write", on the other core) stores the page's bytes as they came, one row
and one transaction per page, and acknowledges every `max_frames // 2` frames, or at
once when the driver waits (it sends a SYNC). A reader thread takes the
acknowledgements (it wakes once per acknowledgement). Where it is used and why pages:
docs/decisions.md ("Simulations log through a writer process that stores pages of steps").

Contract, as `GroupCommitSink` in `async` mode: `flush()` returns once everything
appended is committed; `close()` flushes and waits for the process to exit; at most
`max_pending` steps are unacknowledged (then `append` blocks); a writer failure is a
one-line `LogError` on the next append, flush or close. Unlike the thread writer, a
step waits in the driver's buffer until the batch fills, flush or close, and
`statistics().committed` is as of the last acknowledgement (up to half the pending
bound behind, until someone waits): meant for runs that end with `close()` (sim), not
daemons. If the driver dies, the writer reads
end of file, having committed everything it received, and exits.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from deepserve.core.records import RunRec, Step

from .. import open_sinks
from ..errors import LogError, one_line
from ..pages import array_header, page_head
from ..pressure import Pressure
from . import child
from .child import ACK, ACK_BODY, CONFIG, ERROR, FINISH, PAGE, PAGE_HEAD, RUN, SYNC
from .fresh import process_writer_config

DEFAULT_BATCH = 1024
DEFAULT_PENDING = 16 * DEFAULT_BATCH


class _WriterGone(Exception):
    """A write to the pipe failed: the writer process has exited."""


class ProcessSink(Pressure):
    """A `LogSink` whose writer is a child process. See the module docstring."""

    def __init__(
        self,
        path: str,
        *,
        synchronous: str | None = None,
        max_pending: int | None = None,
        max_batch: int | None = None,
        high_water: int | None = None,
    ) -> None:
        batch = DEFAULT_BATCH if max_batch is None else max_batch
        pending = max(DEFAULT_PENDING, batch) if max_pending is None else max_pending
        if batch < 1 or pending < 1:
            raise ValueError("max_pending and max_batch must be positive")
        self.label = path
        self.durability = "async"
        self.on_commit: Callable[[int], None] | None = None
        self._max_batch = batch
        self._max_frames = max(1, pending // batch)  # unacknowledged frames
        # The writer acknowledges every `_ack_every` frames, so a sender blocked on a
        # full window always has an acknowledgement coming.
        self._ack_every = max(1, self._max_frames // 2)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._commit_cond = self._cond
        self._init_pressure(pending, high_water)
        self._buf: list[Step] = []
        self._ok = False  # append allowed: begun, not closed, no error
        self._closing = False
        self._error: str | None = None
        self._ticket = 0  # steps appended
        self._committed = 0  # steps committed
        self._sent = 0  # frames written to the pipe (runs and batches)
        self._acked = 0  # frames the writer committed
        self._transactions_done = 0  # of them, RUNs and PAGEs (not SYNCs)
        self._frames = child.FrameEncoder()
        self._eof = threading.Event()  # the reader is done: the writer has exited
        self._owner = os.getpid()
        cfg = {**process_writer_config(path, synchronous), "ack_every": self._ack_every}
        self._proc, self._out, self._ack_fd = self._start(cfg)
        self.pid = self._proc.pid
        self._reader = threading.Thread(
            target=self._read_acks, name=f"deepserve-log-acks:{path}", daemon=True
        )
        self._reader.start()
        open_sinks.track(self)  # closed at exit if nobody closes it

    def _start(self, cfg: dict[str, Any]) -> tuple[subprocess.Popen[bytes], int, int]:
        try:
            proc, (data_w, ack_r) = child.spawn("write")
        except OSError as exc:
            raise LogError(f"{self.label}: cannot start the log writer process: {exc}") from None
        with contextlib.suppress(OSError):  # a writer dead already: the reader reports it
            child.write_all(data_w, child.frame(CONFIG, msgspec.msgpack.encode(cfg)))
        return proc, data_w, ack_r

    # ---- the driver's side ---------------------------------------------------
    def begin_run(self, run: RunRec) -> None:
        """Start a run: its record is committed before this returns, so that a run
        already in the log (same run id and process) is refused here, with a
        `LogError`; the sink is then closed, having written nothing of the run."""
        try:
            with self._sending(), self._lock:
                if self._error is not None or self._closing:
                    self._raise_state()
                if self._buf:
                    self._send_steps()
                self._send_frame(RUN, run)
                target = self._sent
                self._cond.wait_for(lambda: self._acked >= target or self._error is not None)
                if self._error is not None:
                    raise LogError(self._error)
                self._ok = True
        except LogError:
            with contextlib.suppress(LogError):
                self.close()
            raise

    def append(self, step: Step) -> int:
        """Buffer a step (no I/O); returns its ticket. Every `max_batch` steps the
        batch is sent, which blocks only while `max_pending` steps are unacknowledged
        (backpressure). Safe from several threads: tickets follow append order."""
        lock = self._lock
        lock.acquire()  # not `with`: this runs once per logged delivery, and `with` costs more
        try:
            buf = self._buf
            if len(buf) < self._max_batch and self._ok:
                buf.append(step)
                ticket = self._ticket = self._ticket + 1
                return ticket
        finally:
            lock.release()
        with self._sending(), self._lock:
            if not self._ok:
                self._raise_state()
            if len(self._buf) >= self._max_batch:
                self._note_pending()  # pending peaks as a full buffer leaves
                self._send_steps()
            self._buf.append(step)
            self._ticket += 1
            return self._ticket

    @property
    def page_steps(self) -> int:
        """The most steps a page holds (`max_batch`): what `append_page` may be given."""
        return self._max_batch

    def append_page(self, body: bytes | bytearray, steps: int, t_first: float, t_last: float) -> int:
        """Store `steps` steps already encoded back to back (each a `Step`'s msgpack array,
        as `core.steps.StepPage` makes them; input times within [t_first, t_last]) as one
        page, after whatever `append` buffered; returns the last ticket. What `SimDriver`
        calls. The body is copied before this returns."""
        if not 0 < steps <= self._max_batch:
            raise ValueError(f"append_page: {steps} steps; a page holds 1..{self._max_batch}")
        with self._sending(), self._lock:
            if not self._ok:
                self._raise_state()
            if self._buf:
                self._send_steps()
            self._wait_for_room(closing=False)
            head = bytes((PAGE,)) + PAGE_HEAD.pack(steps, t_first, t_last) + array_header(steps)
            self._write(child.HEADER.pack(len(head) + len(body)) + head, body)
            self._ticket += steps
            self._note_pending()  # the page's steps count as pending until acknowledged
            return self._ticket

    @property
    def committed_ticket(self) -> int:
        return self._committed

    def _transactions(self) -> int:
        return self._transactions_done

    def flush(self) -> None:
        """Send the buffer; return once everything appended so far is committed."""
        if threading.current_thread() is self._reader:
            raise RuntimeError("flush() from on_commit would wait for itself")
        with self._sending(), self._lock:
            if self._buf and self._ok:
                self._send_steps()
            self._sync()
            target = self._sent
            self._cond.wait_for(lambda: self._acked >= target or self._error is not None)
            if self._error is not None:
                raise LogError(self._error)

    def _wait_low_water(self) -> None:
        # Pages since the last acknowledgement are acknowledged only when more follow:
        # a producer waiting for room must ask, or it could wait for ever.
        with self._sending(), self._lock:
            self._sync()
        super()._wait_low_water()

    def close(self) -> None:
        """Flush, let the writer process finish and exit. Idempotent."""
        first = False
        try:
            with self._sending(), self._lock:
                first = not self._closing
                self._closing = True
                self._ok = False
                self._cond.notify_all()  # blocked appenders give up: nothing after close
                if first and self._buf and self._error is None:
                    self._send_steps(closing=True)
                if first and self._error is None:  # a clean close: the runs' closing records
                    self._write(child.frame(FINISH, b""))
        except LogError:
            pass  # recorded in self._error, raised below
        if first:
            os.close(self._out)  # end of file: the writer commits what it has and exits
            self._reader.join()
            open_sinks.untrack(self)
        if self._error is not None:
            raise LogError(self._error)

    def __enter__(self) -> ProcessSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _sending(self) -> Iterator[None]:
        """Around a locked block that may write to the pipe. A write fails when the
        writer has exited; its last words (an ERROR frame, its exit status) come over
        the ack pipe, so wait for the reader — without the lock, which it needs."""
        try:
            yield
        except _WriterGone as gone:
            self._eof.wait(10)
            with self._lock:
                self._fail(
                    f"{self.label}: the log writer process is gone ({gone})", keep_first=True
                )
            raise LogError(self._error) from None

    # ---- under the lock ----------------------------------------------------------
    def _raise_state(self) -> None:
        if self._error is not None:
            raise LogError(self._error)
        if self._closing:
            raise LogError(f"{self.label}: the log sink is closed")
        raise LogError(f"{self.label}: append() before begin_run()")

    def _sync(self) -> None:
        """Ask the writer to acknowledge every frame sent, if some is not yet."""
        if self._ok and self._acked < self._sent:
            self._write(child.frame(SYNC, b""))

    def _send_steps(self, closing: bool = False) -> None:
        # Wait for room before taking the buffer: whoever holds the lock after the
        # wait sends everything buffered, so frames leave in append order.
        self._wait_for_room(closing)
        batch, self._buf = self._buf, []
        if batch:
            self._send_frame(PAGE, batch)

    def _wait_for_room(self, closing: bool) -> None:
        since = time.perf_counter()
        blocked = False
        while self._sent - self._acked >= self._max_frames:
            if self._error is not None or (self._closing and not closing):
                self._raise_state()
            blocked = True
            self._cond.wait()
        if blocked:
            self._note_blocked(since)

    def _send_frame(self, kind: int, obj: Any) -> None:
        try:
            # The page's time bounds, found here: decoding them in the writer process cost it
            # ~0.9 µs of CPU a step (measured), where this scan costs the driver ~0.06 µs.
            head = PAGE_HEAD.pack(*page_head(obj)) if kind == PAGE else b""
            data = self._frames.encode(kind, obj, head)
        except Exception as exc:  # a malformed record: as the thread writer, a LogError
            self._fail(f"{self.label}: log writer failed: {type(exc).__name__}: {exc}")
            raise LogError(self._error) from None
        self._write(data)

    def _write(self, data: bytes | bytearray, body: bytes | bytearray = b"") -> None:
        try:
            if body:
                child.write_all_parts(self._out, data, body)
            else:
                child.write_all(self._out, data)
        except OSError as exc:
            self._ok = False
            raise _WriterGone(one_line(exc)) from None
        self._sent += 1

    def _fail(self, text: str, keep_first: bool = False) -> None:
        if self._error is None or not keep_first:
            self._error = one_line(text)
        self._ok = False
        self._buf = []
        self._cond.notify_all()

    # ---- the reader thread ---------------------------------------------------------
    def _read_acks(self) -> None:
        try:
            with open(self._ack_fd, "rb") as acks:
                while (payload := child.read_frame(acks)) is not None:
                    if payload[0] == ACK:
                        self._acked_frames(*ACK_BODY.unpack_from(payload, 1))
                    elif payload[0] == ERROR:
                        with self._lock:
                            self._fail(payload[1:].decode("utf-8", "replace"))
        except Exception as exc:  # noqa: BLE001 — a bug here must not leave waiters hanging
            with self._lock:
                self._fail(f"{self.label}: reading the log writer's acks failed: {exc!r}")
        code = self._proc.wait()  # the ack pipe closes when the writer exits
        with self._lock:
            if self._error is None and (not self._closing or self._acked < self._sent):
                self._fail(
                    f"{self.label}: the log writer process exited unexpectedly "
                    f"({child.exit_text(code)}); steps after #{self._committed} may be lost"
                )
            self._cond.notify_all()
        self._eof.set()  # after the last words are recorded: `_sending` waits for them

    def _acked_frames(self, frames: int, steps: int, transactions: int) -> None:
        with self._lock:
            grew = steps > self._committed
            self._acked = frames
            self._committed = steps
            self._transactions_done = transactions
            self._cond.notify_all()
        callback = self.on_commit
        if grew and callback is not None:
            try:
                callback(steps)
            except Exception as exc:  # noqa: BLE001 — surfaced to the driver as one line
                with self._lock:
                    self._fail(
                        f"{self.label}: on_commit callback raised {type(exc).__name__}: {exc}"
                    )


def _abandon_in_child() -> None:
    """After a bare fork (no exec): the child's copies of our sinks must neither write
    (the parent's buffered steps a second time) nor hold the pipe open (the writer
    would never see end of file, and the parent's close() would wait for the child)."""
    for sink in open_sinks.tracked():
        if not isinstance(sink, ProcessSink):
            continue
        sink._error = f"{sink.label}: this log sink belongs to process {sink._owner}"
        sink._ok = False
        sink._closing = True
        for fd in (sink._out, sink._ack_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        open_sinks.untrack(sink)


os.register_at_fork(after_in_child=_abandon_in_child)
