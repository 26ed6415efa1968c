"""`SimDriver`: a discrete-event loop on a virtual clock.

Pending deliveries are kept by time: a heap of the distinct times, and for each time its
(seq, envelope, timer key) entries in seq order; they leave in (time, seq) order, one delivery at
a time, and time jumps to the next one. Same seed and same external inputs give the same log,
byte for byte.

Why not one heap of (time, seq, ...) tuples: heapq compared those element by element (~a
quarter of a delivery's entries share their time with another), where a heap of floats compares
one float, and an entry at a time already pending costs no heap operation at all.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Any

from .cell import execute, settle_ask
from .driver import ASK_SRC, AskError, DriverBase
from .envelope import Envelope
from .messages import Message, Started
from .records import DEAD, FULL, LATE, LogSink, Step
from .steps import StepPage, make_step

Invariant = Callable[["SimDriver"], None]
Entry = tuple[int, Envelope, "str | None"]  # (seq, envelope, timer key or None)
LOG_BATCH = 1024  # records handed to the sink at a time (a page of the process writer's)
STALE_SLACK = 128  # cancelled timers' entries tolerated, beyond as many as the live times


class SimDriver(DriverBase):
    mode = "sim"
    # For checkers (`invariants`): the cell of the last delivery, and a flag a checker sets to end
    # the current `run` after it. Class defaults, set on the instance only when a checker runs: as
    # two more instance attributes set in __init__ (30 in all, CPython 3.11's limit of shared
    # instance-dict keys) the pure build's loop ran ~3 % fewer deliveries a CPU second (measured).
    step_cell: Any = None
    halt: bool = False

    def __init__(
        self,
        seed: int = 0,
        sink: LogSink | None = None,
        mailbox_capacity: int = 65_536,
        run_id: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        # (the base's arguments spelled out, not `**kwargs`: mypyc, compiled.py, passes
        # a `**kwargs` through to a compiled base wrongly)
        super().__init__(seed, sink, mailbox_capacity, run_id, config)
        self.now = 0.0
        # Times as `Any`: the compiled build would unbox a float read from these and box it
        # again for the next lookup; kept as objects, one box serves the heap and the dict.
        self._times: list[Any] = []  # a heap of the times in `_due`
        self._due: dict[Any, list[Entry]] = {}  # time -> its entries, in seq order
        self._seq = 0
        self._timer_count = 0  # timers' entries queued, cancelled ones included (`_compact`)
        self.deliveries = 0
        self.invariants: list[Invariant] = []  # called after every delivery (chaos/invariants.py)
        self._depth: dict[str, int] = {}  # due, undelivered non-timer messages per address
        # External inputs scheduled for later: the outside world's, not yet in any
        # mailbox. They enter the heap (and count against the target's capacity)
        # only when virtual time reaches them, so a whole trace injected up front
        # does not make mailboxes read as full.
        self._scheduled: list[tuple[float, int, Envelope, str | None]] = []
        # Records reach the sink `LOG_BATCH` at a time (or the sink's `page_steps`), and
        # whenever `run` returns, in delivery order: where the sink stores pages
        # (`append_page`), encoded as they are made into one `StepPage`; else as Steps, kept
        # here and handed over one `append` each.
        self._log_buf: list[Step] = []
        self._append_page: Callable[[bytes, int, float, float], int] | None = getattr(
            sink, "append_page", None
        )
        self._page: StepPage | None = None if self._append_page is None else StepPage()
        self._page_steps = min(LOG_BATCH, int(getattr(sink, "page_steps", LOG_BATCH)))

    # ---- the outside world -------------------------------------------------
    def spawn(self, addr: str, cls: type, *, src: str = "ext/operator", **kwargs: Any) -> str:
        """Start a root actor now (an external, logged input)."""
        env = self._spawn_env(addr, cls, kwargs, src, self.now)
        self._push(self.now, env)
        return addr

    def inject(
        self,
        dst: str,
        msg: Message,
        *,
        at: float | None = None,
        corr: str | None = None,
        src: str = "ext/input",
        ask: bool = False,
    ) -> int:
        """Schedule an external input at virtual time `at` (default: now)."""
        at = self.now if at is None else at
        if at < self.now:
            raise ValueError(f"at={at} is in the past (now={self.now})")
        env = self._external_env(dst, msg, corr, src, at, ask)
        if at > self.now:
            self._seq += 1  # the same order as if it had been pushed now
            heappush(self._scheduled, (at, self._seq, env, None))
        else:
            self._push(at, env)
        return env.msg_id

    def ask(self, dst: str, msg: Message, timeout_s: float, corr: str | None = None) -> Any:
        """Request/reply from outside, in virtual time: runs the loop until the
        answer arrives or `timeout_s` of virtual time passed. Returns the reply;
        raises `AskError` (request id, target, reason) like `AsyncDriver.ask`. A
        reply after the timeout is recorded (input kind `late`), not delivered."""
        if not timeout_s > 0:
            raise ValueError(f"ask needs a positive timeout_s, got {timeout_s!r}")
        rid = self.inject(dst, msg, corr=corr, src=ASK_SRC, ask=True)
        slot: list[Any] = [False, None]
        self._waiters[rid] = slot
        deadline = self.now + timeout_s
        try:
            while not slot[0] and self.run(until=deadline, max_deliveries=1):
                pass
        finally:
            del self._waiters[rid]
        if not slot[0]:
            self.now = max(self.now, deadline)
            raise AskError(rid, dst, f"timeout after {timeout_s}s")
        return self._ask_result(rid, dst, slot[1])

    def _answer(self, slot: list[Any], msg: Any) -> None:
        slot[0], slot[1] = True, msg

    def pending(self) -> int:
        """Deliveries not yet made: due messages, timers and scheduled inputs."""
        return sum(len(b) for b in self._due.values()) + len(self._scheduled)

    def _next_time(self) -> float:
        """Virtual time of the next delivery (inf when nothing is pending)."""
        heap_t: float = self._times[0] if self._times else float("inf")
        return min(heap_t, self._scheduled[0][0]) if self._scheduled else heap_t

    def _admit_due(self) -> None:
        """Move scheduled external inputs whose time has come into the queue."""
        sched, times, depth = self._scheduled, self._times, self._depth
        t = sched[0][0] if not times or sched[0][0] < times[0] else times[0]
        while sched and sched[0][0] <= t:
            at, seq, env, _ = heappop(sched)
            depth[env.dst] = depth.get(env.dst, 0) + 1
            self._add(at, (seq, env, None))

    def _add(self, t: Any, entry: Entry) -> None:
        """Queue `entry` at time `t`, in seq order among that time's entries (a scheduled
        input's seq was drawn when it was injected, and may be older than theirs)."""
        bucket = self._due.get(t)
        if bucket is None:
            self._due[t] = [entry]
            heappush(self._times, t)
        elif bucket[-1][0] < entry[0]:
            bucket.append(entry)
        else:
            insort(bucket, entry)

    # ---- the loop ----------------------------------------------------------
    def run(self, until: float | None = None, max_deliveries: int | None = None) -> int:
        """Deliver until the heap is empty, virtual time passes `until`, or the
        delivery budget is spent. Returns the number of deliveries made."""
        try:
            return self._loop(until, -1 if max_deliveries is None else max_deliveries)
        finally:
            self._flush_log()  # what a caller reads from the sink is complete when run returns

    def _loop(self, until: float | None, budget: int) -> int:
        times, due, cells, timers = self._times, self._due, self.cells, self._timers
        sink, depth, sched, log_buf, page = self.sink, self._depth, self._scheduled, self._log_buf, self._page
        page_steps = self._page_steps
        invariants = self.invariants
        n = 0
        while n != budget:
            if sched and (not times or sched[0][0] <= times[0]):
                if until is not None and sched[0][0] > until:
                    break
                self._admit_due()
            elif not times or (until is not None and times[0] > until):
                break
            tb = times[0]
            bucket = due[tb]
            seq, env, key = bucket.pop(0)
            if not bucket:
                del due[tb]
                heappop(times)
            t: float = tb
            if key is not None:
                self._timer_count -= 1
                tkey = (env.dst, key)
                if timers.get(tkey) != seq:
                    continue  # cancelled or replaced
                del timers[tkey]
            self.now = t
            dst = env.dst
            if key is None:
                depth[dst] -= 1
            cell = cells.get(dst)
            if cell is None or not cell.alive:
                if type(env.msg) is not Started:
                    self._bounce(env, t, DEAD)
                    continue
                cell = self._new_cell(dst)  # a spawn, decided when it arrives
            elif type(env.msg) is Started:
                self._bounce(env, t, DEAD)  # the address is taken by a live actor
                continue
            elif env.reply_to is not None and not settle_ask(cell, env):
                self._bounce(env, t, LATE)
                continue
            snapshot = execute(cell, env, t)
            if sink is not None:  # `_log`, inlined
                if page is not None:
                    if page.add_delivery(cell, env, t, snapshot) >= page_steps:
                        self._flush_log()
                else:
                    log_buf.append(make_step(cell, env, t, snapshot))
                    if len(log_buf) >= LOG_BATCH:
                        self._flush_log()
            if cell.ctx.outputs:
                self._route(cell, cell.ctx.outputs, t)
            if not cell.alive:
                self._retire(cell, t)
                self._note_stop(cell)
            n += 1
            if invariants:  # (one list truth test a delivery when no checker is set)
                self.step_cell = cell  # the actor just stepped, for checkers that look at it alone
                for check in invariants:
                    check(self)
                if self.halt:  # a checker ended this `run` call (chaos: every request is terminal)
                    self.halt = False
                    break
        if until is not None and self._next_time() > until:
            self.now = max(self.now, until)
        self.deliveries += n
        if not times and not sched:
            self.snapshot_live()  # the run has ended: nothing is pending
        return n

    def snapshot_live(self) -> None:
        """Log every live actor's final state now (done by `run` when nothing is
        pending; call it after a run stopped early by `until` or a budget)."""
        self._snapshot_live(self.now)
        self._flush_log()

    # ---- the log ---------------------------------------------------------------
    def _log(self, step: Step) -> None:
        page = self._page
        if page is not None:
            if page.add(step) >= self._page_steps:
                self._flush_log()
            return
        buf = self._log_buf
        buf.append(step)
        if len(buf) >= LOG_BATCH:
            self._flush_log()

    def _flush_log(self) -> None:
        """Hand the buffered records to the sink, in order, and empty the buffer
        (also when the sink fails: its error says what was lost)."""
        page = self._page
        if page is not None:
            if page.steps:
                steps, t_first, t_last = page.steps, page.t_first, page.t_last
                self._append_page(page.take(), steps, t_first, t_last)  # type: ignore[misc]
            return
        buf = self._log_buf
        if not buf:
            return
        try:
            append = self.sink.append  # type: ignore[union-attr]
            for step in buf:
                append(step)
        finally:
            buf.clear()

    # ---- routing hooks (the core is `DriverBase._route`) ---------------------
    def _push(self, t: float, env: Envelope, key: str | None = None) -> int:
        if key is None:
            self._depth[env.dst] = self._depth.get(env.dst, 0) + 1
        seq = self._seq = self._seq + 1
        self._add(t, (seq, env, key))
        return seq

    def _enqueue(self, env: Envelope, t: float) -> bool:
        # Whether the target is alive is decided when the message is due (`run`).
        dst = env.dst
        depth = self._depth
        n = depth.get(dst, 0)
        if n >= self.mailbox_capacity:
            cell = self.cells.get(dst)
            if cell is not None:
                cell.stats.mailbox_full += 1
            self._bounce(env, t, FULL)
            return False
        depth[dst] = n + 1  # `_push`, inlined (every message between actors)
        seq = self._seq = self._seq + 1
        # `_add`, inlined: a new entry's seq is the newest, so it goes last at its time
        tb: Any = t  # boxed once, for the dict and the heap
        bucket = self._due.get(tb)
        if bucket is None:
            self._due[tb] = [(seq, env, None)]
            heappush(self._times, tb)
        else:
            bucket.append((seq, env, None))
        return True

    def _notice(self, env: Envelope, t: float) -> None:
        self._push(t, env)  # past the capacity: one notice per message the sender sent

    def _set_timer(self, deadline: float, env: Envelope, key: str) -> None:
        timers = self._timers
        timers[(env.dst, key)] = self._push(deadline, env, key)
        n = self._timer_count = self._timer_count + 1
        # (`_times` counts the live times and, about one each, the dead entries')
        if 2 * (n - len(timers)) > len(self._times) + STALE_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Drop cancelled and replaced timers' entries (answered asks' timeouts, mostly), which
        otherwise stay queued until their deadlines: on the Mooncake trace ~1,100 times queued,
        ~90 % of them dead, for every push and pop to sift through (~100 once dropped). Run
        when they outnumber the other times queued (plus a slack): O(1) a timer, amortized.
        The live entries keep their (time, seq) order; the loop's references stay valid."""
        times, due, timers = self._times, self._due, self._timers
        for t in list(due):
            bucket = due[t]
            bucket[:] = [e for e in bucket if e[2] is None or timers.get((e[1].dst, e[2])) == e[0]]
            if not bucket:
                del due[t]
        times[:] = list(due)
        heapify(times)
        self._timer_count = len(timers)

    def _spawn_child(self, env: Envelope, t: float) -> None:
        self._push(t, env)  # the child's cell is made when `Started` arrives

    def _timer_entries(self) -> list[tuple[float, int, Envelope, str | None]]:
        return [(t, seq, env, key) for t, bucket in self._due.items() for seq, env, key in bucket]

    def stats(self) -> dict[str, dict[str, Any]]:
        for addr, cell in self.cells.items():
            cell.stats.mailbox_depth = self._depth.get(addr, 0)
        return super().stats()
