"""The one writer per process: a bounded queue and a group-commit thread.

`append` only queues (no I/O) and returns a ticket: the step's position in the
process's append order, 1, 2, 3, ... The writer thread takes everything queued (up
to `max_batch`), commits it as one transaction, then advances `committed_ticket` and
calls `on_commit(ticket)`. While a transaction is in flight new steps pile up and go
into the next one: batches grow with load, commits stay few.

Backpressure (`pressure.py`, docs/kernel.md): at `high_water` pending steps the sink
is under pressure and `await wait_for_room()` holds a producer at the driver's edge;
at most `max_pending` items wait in the queue (plus one batch in flight), where
`append` blocks until the writer takes a batch — the last resort, counted in
`statistics()`. The bound also caps outbox release latency at about max_pending /
write rate, hence the smaller default for `outbox` (a few thousand steps: ~100 ms at
saturation).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from deepserve.core.records import RunRec, Step

from . import open_sinks
from .api import Durability
from .errors import LogError, one_line
from .pressure import Pressure

DEFAULT_MAX_PENDING = {"async": 32_768, "outbox": 4_096}
DEFAULT_MAX_BATCH = 2_048


class BatchStore(Protocol):
    """A backend's transaction writer, created and used only in the writer thread."""

    def write(self, items: Sequence[Step | RunRec]) -> int:
        """Commit `items` in one transaction; return how many were steps."""
        ...

    def end_runs(self) -> None:
        """Store the closing record of every run written (`schema.run_ends`)."""
        ...

    def close(self) -> None: ...


class GroupCommitSink(Pressure):
    """A `LogSink` writing through one background thread, one batch per transaction.

    `on_commit`: optional callable set by the driver, called *from the writer thread*
    with the highest committed ticket after each transaction holding steps; every
    ticket up to it is committed. Values only grow. A driver holding an actor's
    outputs for ticket `t` registers the hold first, then checks `committed_ticket`
    (the commit may have happened in between), else waits for `on_commit(>= t)`.
    """

    def __init__(
        self,
        store_factory: Callable[[], BatchStore],
        *,
        label: str,
        durability: Durability = "async",
        max_pending: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        high_water: int | None = None,
        linger_s: float = 0.0,
        flush_s: float = 0.0,
    ) -> None:
        if durability not in ("async", "outbox"):
            raise ValueError(f"durability must be 'async' or 'outbox', not {durability!r}")
        if max_pending is None:
            max_pending = DEFAULT_MAX_PENDING[durability]
        if max_pending < 1 or max_batch < 1:
            raise ValueError("max_pending and max_batch must be positive")
        self.label = label
        self.durability = durability
        self.on_commit: Callable[[int], None] | None = None
        self._max_pending = max_pending
        self._max_batch = max_batch
        # Woken from idle, the writer waits this long for more before it commits: a daemon's
        # steps trickle in one by one, and a commit (and a wake-up of this thread) per step was
        # ~30 % of its CPU under HTTP load (py-spy, issue 30). 0: commit at once (the default).
        if not 0 <= linger_s <= 1:
            raise ValueError(f"linger_s must be in [0, 1], got {linger_s}")
        self._linger_s = linger_s
        # The flush window (`async` only): at most one commit every `flush_s`, so that a page
        # (page_store.py) holds a window's steps, not the few a fast commit found queued: a
        # daemon's pages compress ~2x better at 0.25 s than at a commit per ~20 ms (measured,
        # issue 30). What it costs: a process killed loses at most the window's steps (they
        # were queued, not committed), as `async` allows. Nobody waits for it: flush(),
        # begin_run(), wait_committed(), close(), a full batch and pressure commit at once.
        if not 0 <= flush_s <= 5:
            raise ValueError(f"flush_s must be in [0, 5], got {flush_s}")
        if flush_s and durability == "outbox":
            raise ValueError("flush_s is for durability='async' (outbox releases outputs on commit)")
        self._flush_s = flush_s
        self._hurry = 0  # threads waiting for a commit: the window is cut short
        self._windowing = False  # the writer waits out the window (appends may cut it short)
        self._last_commit = 0.0
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # writer waits for items
        self._room = threading.Condition(self._lock)  # appenders wait for queue space
        self._done = threading.Condition(self._lock)  # flushers wait for commits
        self._commit_cond = self._done
        self._init_pressure(max_pending, high_water)
        self._queue: list[Step | RunRec] = []
        self._idle = False
        self._room_waiters = 0
        self._ticket = 0  # last ticket handed out
        self._committed = 0  # last ticket committed
        self._items_in = 0
        self._items_done = 0
        self._has_run = False
        self._closing = False
        self._error: str | None = None
        self.transactions = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(store_factory,),
            name=f"deepserve-log-writer:{label}",
            daemon=True,
        )
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise LogError(self._error)
        open_sinks.track(self)  # closed at exit if nobody closes it

    # ---- the driver's side ---------------------------------------------------
    def begin_run(self, run: RunRec) -> None:
        """Start a run: its record is committed before this returns, so that a run
        already in the log (same run id and process) is refused here, with a
        `LogError`; the sink is then closed, having written nothing of the run."""
        if self._in_writer():
            raise RuntimeError("begin_run() from on_commit would wait for itself")
        try:
            with self._lock:
                # the previous run's steps commit on their own, not with a refused run
                self._wait_done(self._items_in)
                self._put(run)
                self._wait_done(self._items_in)
                self._has_run = True
        except LogError:
            with contextlib.suppress(LogError):
                self.close()
            raise

    def append(self, step: Step) -> int:
        """Queue a step (no I/O); returns its ticket. Blocks only while the queue is
        full (backpressure). Safe from several threads: tickets follow queue order."""
        with self._lock:
            if not self._has_run:
                self._check_open()  # a refused run closed the sink: say that first
                raise LogError(f"{self.label}: append() before begin_run()")
            self._put(step)
            self._ticket += 1
            self._note_pending()
            return self._ticket

    def _put(self, item: Step | RunRec) -> None:
        """Under the lock."""
        self._check_open()
        # An on_commit callback that appends runs in the writer thread, which must not
        # wait for itself: it may overshoot the bound by what one callback appends.
        if len(self._queue) >= self._max_pending and not self._in_writer():
            since = time.perf_counter()
            self._room_waiters += 1
            while (
                len(self._queue) >= self._max_pending and self._error is None and not self._closing
            ):
                self._room.wait()
            self._room_waiters -= 1
            self._note_blocked(since)
            self._check_open()
        self._queue.append(item)
        self._items_in += 1
        if self._idle:
            self._idle = False
            self._work.notify()
        elif self._windowing and len(self._queue) >= self._full:
            self._work.notify()

    def _check_open(self) -> None:
        if self._error is not None or self._closing:
            raise LogError(self._error or f"{self.label}: the log sink is closed")

    def _in_writer(self) -> bool:
        return threading.current_thread() is self._thread

    @property
    def committed_ticket(self) -> int:
        return self._committed

    def wait_committed(self, ticket: int, timeout: float | None = None) -> bool:
        """Block until `ticket` is committed; False on timeout."""
        with self._lock:
            self._hurry += 1
            self._work.notify()
            try:
                ok = self._done.wait_for(lambda: self._committed >= ticket or self._error, timeout)
            finally:
                self._hurry -= 1
            if self._error is not None:
                raise LogError(self._error)
            return bool(ok)

    def flush(self) -> None:
        """Block until everything appended so far is committed (durable against a
        process kill; against power loss too with synchronous=FULL / PostgreSQL)."""
        if self._in_writer():
            raise RuntimeError("flush() from on_commit would wait for itself")
        with self._lock:
            self._wait_done(self._items_in)

    def _wait_done(self, items: int) -> None:
        """Under the lock: until `items` queued items are committed."""
        self._hurry += 1
        self._work.notify()
        try:
            self._done.wait_for(lambda: self._items_done >= items or self._error is not None)
        finally:
            self._hurry -= 1
        if self._error is not None:
            raise LogError(self._error)

    def close(self) -> None:
        """Flush, stop the writer, release the database. Idempotent."""
        with self._lock:
            already = self._closing
            self._closing = True
            self._work.notify()
            self._room.notify_all()  # blocked appenders give up: nothing after close
            self._done.notify_all()  # and so do producers waiting for room
        if not already:
            self._thread.join()
            open_sinks.untrack(self)
        if self._error is not None:
            raise LogError(self._error)

    def __enter__(self) -> GroupCommitSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _transactions(self) -> int:
        return self.transactions

    # ---- the writer thread -----------------------------------------------------
    def _run(self, store_factory: Callable[[], BatchStore]) -> None:
        try:
            store = store_factory()
        except BaseException as exc:  # noqa: BLE001 — reported to the opener as one line
            self._fail(exc, opening=True)
            self._ready.set()
            return
        self._ready.set()
        try:
            while (batch := self._take()) is not None:
                steps = store.write(batch)
                self._committed_batch(len(batch), steps)
            end_runs = getattr(store, "end_runs", None)  # (optional: a test's store may keep none)
            if self._error is None and end_runs is not None:  # closed, all committed: the runs' ends
                end_runs()
        except BaseException as exc:  # noqa: BLE001 — surfaced to the driver on its next call
            self._fail(exc)
        finally:
            try:
                store.close()
            except Exception as exc:  # noqa: BLE001 — e.g. the database went away
                if self._error is None:
                    self._fail(exc)

    def _take(self) -> list[Step | RunRec] | None:
        with self._lock:
            woke = False
            while not self._queue and not self._closing and self._error is None:
                self._idle = woke = True
                self._work.wait()
            self._idle = False
            if woke and self._linger_s and len(self._queue) < self._max_batch and not self._closing:
                self._work.wait(self._linger_s)  # appends do not notify meanwhile (not idle); close does
            if self._flush_s:
                self._wait_window()
            if self._error is not None or not self._queue:
                return None
            queue = self._queue
            n = self._batch_items(queue)
            if n == len(queue):
                batch, self._queue = queue, []
            else:
                batch = queue[:n]
                del queue[:n]
            if self._room_waiters:
                self._room.notify_all()
            return batch

    def _batch_items(self, queue: list[Step | RunRec]) -> int:
        """How many of the queued items the next transaction takes: `max_batch` items (a step
        or a run's record each), fewer when pages of steps (`paged_sink.py`) are among them."""
        return min(len(queue), self._max_batch)

    @property
    def _full(self) -> int:
        """Queued items that end a flush window at once: a full batch, or pressure."""
        return min(self._max_batch, self._high_water)

    def _wait_window(self) -> None:
        """Under the lock: until the flush window since the last commit has passed, or someone
        needs a commit now (a flush, a closing, a full batch, pressure)."""
        self._windowing = True
        try:
            while (
                not self._closing and not self._hurry and self._error is None
                and len(self._queue) < self._full
                and (left := self._last_commit + self._flush_s - time.monotonic()) > 0
            ):  # fmt: skip
                self._work.wait(left)
        finally:
            self._windowing = False

    def _committed_batch(self, items: int, steps: int) -> None:
        with self._lock:
            self._last_commit = time.monotonic()
            self.transactions += 1
            self._items_done += items
            self._committed += steps
            upto = self._committed
            self._done.notify_all()
        callback = self.on_commit
        if steps and callback is not None:
            try:
                callback(upto)
            except Exception as exc:
                raise LogError(
                    f"{self.label}: on_commit callback raised {type(exc).__name__}: {exc}"
                ) from exc

    def _fail(self, exc: BaseException, opening: bool = False) -> None:
        if isinstance(exc, LogError):
            msg = str(exc)
        else:
            what = "cannot open the log" if opening else "log writer failed"
            msg = f"{self.label}: {what}: {type(exc).__name__}: {exc}"
        with self._lock:
            self._error = one_line(msg)
            self._queue = []
            self._done.notify_all()
            self._room.notify_all()


def runs_and_steps(items: Sequence[Step | RunRec]) -> list[RunRec | list[Step]]:
    """A writer's batch cut into its run records and the runs of steps between them (an
    `EncodedSteps`, `paged_sink.py`, counts as steps)."""
    parts: list[RunRec | list[Step]] = []
    steps: list[Step] = []
    for item in items:
        if type(item) is not RunRec:
            steps.append(item)
            continue
        if steps:
            parts.append(steps)
            steps = []
        parts.append(item)  # type: ignore[arg-type]  # a RunRec: steps went above
    if steps:
        parts.append(steps)
    return parts


def count_steps(items: Sequence[Step | RunRec]) -> int:
    return sum(getattr(item, "steps", 1) for item in items if type(item) is not RunRec)
