"""A request's output queue on the frontend (issue 30 §1, CPU per request).

`Runtime._on_external` puts each of a request's token chunks and its terminal message here; the
HTTP side (`first_item`, `Generation._next`) awaits them. asyncio.Queue did that with a task
counter and an Event cleared at every put, a loop lookup through a Python mixin at every wait,
and a putters' queue nobody uses (puts never wait here): ~4 % of the daemon's event-loop CPU
under `bench http`'s load (py-spy). `Stream` keeps what the frontend uses — `put_nowait`,
`get`, `get_nowait`, `full`, `empty`, `qsize` — with asyncio.Queue's semantics, cancellation
included (an awakened getter that is cancelled passes the wake-up on; no item is lost) — and
`get_within`, `get` under `asyncio.timeout` (`get_within_readable`) without its context, and
`offer`, a put unless full (`offer_readable`) in one call.
asyncio.Queue is the readable version: tests/daemon/test_stream_queue.py runs both through the
same operations and compares what each returns or raises.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Stream:
    __slots__ = ("_getters", "_items", "_loop", "maxsize")

    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize
        self._items: deque[Any] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first wait (asyncio.Queue's)

    def _loop_of(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def full(self) -> bool:
        return 0 < self.maxsize <= len(self._items)

    def put_nowait(self, item: Any) -> None:
        if 0 < self.maxsize <= len(self._items):
            raise asyncio.QueueFull
        self._items.append(item)
        self._wake_one()

    def offer(self, item: Any) -> bool:
        """`offer_readable(self, item)`: put unless full (then dropped); whether it was put. The
        runtime's, for each streamed chunk."""
        items = self._items
        if 0 < self.maxsize <= len(items):
            return False
        items.append(item)
        self._wake_one()
        return True

    def _wake_one(self) -> None:
        getters = self._getters
        while getters:
            waiter = getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def get_nowait(self) -> Any:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    async def get(self) -> Any:
        items = self._items
        while not items:
            waiter = (self._loop or self._loop_of()).create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except BaseException:
                self._abandon(waiter)
                raise
        return items.popleft()

    def _abandon(self, waiter: asyncio.Future[Any]) -> None:
        """asyncio.Queue.get's, for a getter that stops waiting: a wake-up it got goes to the next."""
        waiter.cancel()
        try:
            self._getters.remove(waiter)
        except ValueError:
            pass
        if self._items and not waiter.cancelled():
            self._wake_one()

    async def get_within(self, timeout_s: float) -> Any:
        """`get_within_readable(self, timeout_s)` (tests/daemon/test_stream_queue.py checks they
        agree) with one timer instead of a `Timeout` context (its enter and exit, a handle
        rescheduled, the task cancelled and un-cancelled when it fires): ~1 % of the daemon's CPU
        under `bench http`'s load (py-spy, the first item's wait). When the time is up, the wait
        ends as the context ends it: the waiter cancelled, or (woken already) the wake-up passed
        on; then TimeoutError, unless the task is being cancelled from outside too."""
        items = self._items
        if items:
            return items.popleft()
        loop = self._loop or self._loop_of()
        when = loop.time() + timeout_s
        expiry: list[Any] = [None, False]  # the current waiter, whether the time is up
        timer = loop.call_soon(_expire, expiry) if when <= loop.time() else loop.call_at(when, _expire, expiry)
        try:
            while not items:
                waiter = loop.create_future()
                expiry[0] = waiter
                self._getters.append(waiter)
                try:
                    await waiter
                    if expiry[1]:  # up while the wake-up was on its way: as the context's cancel
                        raise asyncio.CancelledError
                except BaseException:
                    self._abandon(waiter)
                    task = asyncio.current_task()
                    if expiry[1] and task is not None and not task.cancelling():
                        raise TimeoutError from None
                    raise
            return items.popleft()
        finally:
            timer.cancel()


def _expire(expiry: list[Any]) -> None:
    """`get_within`'s time is up: its waiter cancelled (a no-op if woken already)."""
    expiry[1] = True
    if expiry[0] is not None:
        expiry[0].cancel()


def offer_readable(q: Any, item: Any) -> bool:
    """The readable version of `Stream.offer`."""
    if q.full():
        return False
    q.put_nowait(item)
    return True


async def get_within_readable(q: Any, timeout_s: float) -> Any:
    """The readable version of `Stream.get_within`."""
    async with asyncio.timeout(timeout_s):
        return await q.get()
