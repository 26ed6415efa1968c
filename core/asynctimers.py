"""`AsyncDriver`'s timers on the wall clock: a heap of (deadline, seq, envelope, key) and one
event-loop callback armed at its top deadline.

A due timer for an actor whose task is parked on an empty mailbox runs in the callback, as a
peer's message runs in the transport's (`_deliver_timer`); any other goes into its actor's
mailbox (`_send` outside a step) and wakes its task. Cancelled timers (an answered ask's timeout) stay in the heap until
they reach its top or the heap is compacted (`_compact_timers`). `AsyncDriver`'s base class
(asyncdriver.py), whose clock and event loop it uses.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import time
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from math import ceil
from typing import Final

from .envelope import Envelope
from .inline import InlineDelivery, mailbox_of

_heappush: Final = heappush  # (Final: a C static in the compiled build, compiled.py)
TIMER_HEAP_SLACK = 1024  # cancelled entries tolerated beyond twice the live timers


def ms_loop_offset(loop: asyncio.AbstractEventLoop) -> float | None:
    """For a loop whose timers run on a whole-millisecond clock read off `time.monotonic`'s
    (uvloop: libuv's `uv_now`, CLOCK_MONOTONIC truncated to the millisecond), how far
    `time.monotonic()` is ahead of `loop.time()` now; None for any other loop (asyncio's own
    reads `time.monotonic` itself) or if the two clocks do not agree to that millisecond."""
    if not type(loop).__module__.startswith("uvloop"):
        return None
    lag = time.monotonic() - loop.time()
    return lag if -0.0001 <= lag < 0.0021 else None


def ms_tick_delay(due: float, loop_now: float) -> float:
    """The `call_later` delay for a callback at `due`, both times on a millisecond-tick loop's
    clock (`loop_now` = `loop.time()`, whole milliseconds): the whole number of milliseconds
    that reaches `due`, rounded up. uvloop rounds a delay to the millisecond and starts it from
    its clock's last whole millisecond, so `due - now` itself fired up to 1.5 ms early, and
    re-armed with under 0.5 ms left it became a `call_soon`: the loop spun until the deadline
    (19,522 wakes for 240 timers in tests/core/test_asynctimers.py). The price: a timer fires
    at the first tick after its deadline, ~0.8 ms late at the median on a quiet loop (it was
    ~0, bought by that spinning)."""
    ms = ceil((due - loop_now) * 1000.0)
    return ms / 1000.0 if ms > 0 else 0.0


def callback_context() -> contextvars.Context:
    """The caller's context, saying "asyncio" to sniffio: the timer callback runs in it. A handler
    run there may spawn a child, and anyio starts a task only where it can tell which async
    library runs: a loop callback is in no task, and on a loop anyio did not start (`asyncio.run`,
    uvicorn's) nothing else says it (anyio: `NoEventLoopError`)."""
    context = contextvars.copy_context()
    try:
        import sniffio
    except ImportError:  # anyio then assumes asyncio whenever a loop runs
        return context
    context.run(sniffio.current_async_library_cvar.set, "asyncio")
    return context


class WallTimers(InlineDelivery):
    """The timer heap and its loop callback; `AsyncDriver.__init__` calls `_init_timers`, its
    `__aenter__` `_start_timers` and its `__aexit__` `_stop_timers`."""

    _loop: asyncio.AbstractEventLoop | None
    _timer_heap: list[tuple[float, int, Envelope, str]]
    _timer_seq: int
    # The loop callback armed for the heap's top deadline (`_arm_timer`, `_fire_timers`)
    _timer_handle: asyncio.TimerHandle | None
    _timers_on: bool  # between __aenter__ and __aexit__: timers fire
    _callback_context: contextvars.Context | None  # what the callback runs in (`callback_context`)
    _t0: float  # `time.monotonic()` at our clock's t=0 (AsyncDriver.__aenter__)
    # uvloop (`ms_loop_offset`): what turns our deadlines into times of the loop's clock, which
    # are armed on its millisecond ticks (`ms_tick_delay`); None: armed as `deadline - now`
    _tick_offset: float | None
    timer_wakes: int  # times the timer callback ran (at the heap's top deadline)
    inline_local: bool  # (AsyncDriver's: deliveries to parked actors may run inline)
    burst: int
    # Called as `timer_late(key, seconds)` for each timer fired, how long after its deadline
    # the event loop got to it (a measurement of the platform, outside the actors' state)
    timer_late: Callable[[str, float], None] | None

    def _init_timers(self) -> None:
        self._loop = None
        self._timer_heap = []
        self._timer_seq = 0
        self._timer_handle = None
        self._timers_on = False
        self._callback_context = None
        self._tick_offset = None
        self.timer_wakes = 0
        self.timer_late = None

    def _start_timers(self) -> None:
        self._timers_on = True
        self._callback_context = callback_context()
        loop = self._loop
        assert loop is not None
        # our clock is `time.monotonic() - self._t0` (asyncdriver: `clock()`)
        self._tick_offset = None if ms_loop_offset(loop) is None else self._t0
        if self._timer_heap:  # timers set before the start
            self._arm_timer(self._timer_heap[0][0])

    def _stop_timers(self) -> None:
        self._timers_on = False
        if self._timer_handle is not None:
            self._timer_handle.cancel()
            self._timer_handle = None

    def _timer_entries(self) -> list[tuple[float, int, Envelope, str]]:
        return self._timer_heap

    def _set_timer(self, deadline: float, env: Envelope, key: str) -> None:
        self._timer_seq += 1
        timers = self._timers
        timers[(env.dst, key)] = self._timer_seq
        heap = self._timer_heap
        if len(heap) > 2 * len(timers) + TIMER_HEAP_SLACK:
            self._compact_timers()
        if (not heap or deadline < heap[0][0]) and self._timers_on:
            self._arm_timer(deadline)
        _heappush(heap, (deadline, self._timer_seq, env, key))

    def _compact_timers(self) -> None:
        """Drop cancelled timers' entries (answered asks' timeouts), which otherwise stay in
        the heap until their deadlines: with a 30 s ask timeout, every ask of the last 30 s,
        its envelope and its `AskFailed`, for the cyclic GC to scan again and again. Run when
        the heap holds more than twice the live timers (plus a slack), so it costs O(1) a
        timer, amortized. The live entries keep their (deadline, seq) order."""
        heap, timers = self._timer_heap, self._timers
        heap[:] = [e for e in heap if timers.get((e[2].dst, e[3])) == e[1]]
        heapify(heap)

    def _arm_timer(self, deadline: float) -> None:
        """Run `_fire_timers` at `deadline` (the heap's new top), in place of the one armed.
        A loop callback, not a task woken by an event: the task's wake-ups (an Event wait, a
        task step, the callback setting the event) were ~4 % of the daemon's event-loop CPU
        under HTTP load (py-spy, issue 30 §1). A handler may run here (`_deliver_timer`), as in a
        transport's receive callback; a child it spawns starts as a task of the driver's group."""
        handle = self._timer_handle
        if handle is not None:
            handle.cancel()
        loop = self._loop
        assert loop is not None
        offset = self._tick_offset
        if offset is None:
            delay = max(0.0, deadline - self.clock())
        else:  # never before the deadline, and not spinning up to it either
            delay = ms_tick_delay(deadline + offset, loop.time())
        self._timer_handle = loop.call_later(delay, self._fire_timers, context=self._callback_context)

    @abc.abstractmethod
    def _fail_in_task(self, exc: Exception) -> None:
        """Raise `exc` in a task of the driver's group (AsyncDriver's): a loop callback's own
        exception is only logged by the loop, where an actor's task failing fails the driver."""

    def _forget_timer_handle(self) -> None:
        # A method, not `self._timer_handle = None` in `_fire_timers`: a type checker would then
        # take the attribute for None in the rest of it, although a handler run there may arm a
        # timer, and mypyc (compiled.py) compiles that narrowing into a run-time type check.
        self._timer_handle = None

    def _deliver_timer(self, env: Envelope, t: float) -> None:
        """A due timer: run now, here, for an actor whose task is parked on an empty mailbox
        (`_run_inline`, then what that step queued for other parked actors: `_drain_inline`),
        as a message from a peer runs in the transport's callback; else into its mailbox
        (`_send`), which wakes its task. Either way its actor's messages keep their order,
        and the same step runs: only the task switch is saved (the NPU's pass ends)."""
        cell = self.cells.get(env.dst)
        if (
            cell is not None and cell.alive and not cell.inline and self.inline_local
            and mailbox_of(cell).parked()
        ):
            self._run_inline(cell, env)
            if self._inline_q:
                self._drain_inline(self.burst)
            return
        self._send(env, t)

    def _fire_timers(self) -> None:
        heap, timers = self._timer_heap, self._timers
        self._forget_timer_handle()
        self.timer_wakes += 1
        try:
            now = self.clock()
            late = self.timer_late
            while heap and heap[0][0] <= now:  # every timer due, in deadline order, in one wake
                deadline, seq, env, key = heappop(heap)
                if timers.get((env.dst, key)) == seq:
                    del timers[(env.dst, key)]
                    t = self.clock()
                    if late is not None:
                        late(key, t - deadline)
                    try:
                        self._deliver_timer(env, t)
                    except Exception as exc:  # noqa: BLE001 — re-raised in a task of the driver
                        self._fail_in_task(exc)
                        break
            # A cancelled timer (an answered ask's timeout) leaves its entry: drop those now
            # at the top, so the next wake is for a live one, not one wake per old deadline.
            # Only here: dropping them on a new timer's arming would empty the heap between
            # asks, and every ask would then arm a callback.
            while heap and timers.get((heap[0][2].dst, heap[0][3])) != heap[0][1]:
                heappop(heap)
        finally:  # early (the loop's clock is coarser than ours) or not: the next top is armed
            if heap and self._timer_handle is None and self._timers_on:
                self._arm_timer(heap[0][0])
