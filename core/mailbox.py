"""A bounded mailbox for `AsyncDriver`: a deque plus a wake-up future.

Cheaper than a general channel on the hot path (no per-message await when work
is queued), and strictly bounded: `put_nowait` refuses past `capacity`, and the
refusal is the driver's to record."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any


class Mailbox:
    __slots__ = ("_q", "capacity", "_waiter", "_space", "puts", "refused", "_loop")

    def __init__(self, capacity: int, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if capacity <= 0:
            raise ValueError(f"mailbox capacity must be positive, got {capacity}")
        self._q: deque[Any] = deque()
        self.capacity = capacity
        # Bare asyncio futures: the driver runs on anyio's asyncio backend, and a
        # future is the cheapest wake-up there is (this is the per-message path).
        self._waiter: asyncio.Future[None] | None = None
        self._space: asyncio.Future[None] | None = None
        self.puts = 0
        self.refused = 0
        # The reader's event loop, if known when it is made: `get` then makes its wake-up
        # future there instead of looking the running loop up (a thread-state read and a
        # `getpid` each time, ~2 % of the daemon's event loop under HTTP load, py-spy)
        self._loop = loop

    def __len__(self) -> int:
        return len(self._q)

    def put_nowait(self, item: Any) -> bool:
        if len(self._q) >= self.capacity:
            self.refused += 1
            return False
        self._q.append(item)
        self.puts += 1
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        return True

    def put_notice(self, item: Any) -> None:
        """Past the capacity: the kernel's notice to a sender about a message it
        sent (`AskFailed`, `Undelivered`), bounded by what the sender sent."""
        self._q.append(item)
        self.puts += 1
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait_below(self, limit: int) -> None:
        """Wait until fewer than `limit` messages are queued (edge backpressure)."""
        while len(self._q) >= limit:
            await self.taken()

    async def taken(self) -> None:
        """Wait for the reader's next take (`get_nowait`; a dead actor's mailbox is drained
        by it too). Any number of waiters share one future, resolved by that take."""
        space = self._space
        if space is None or space.done():
            loop = self._loop
            if loop is None:
                loop = asyncio.get_running_loop()
            self._space = space = loop.create_future()
        # Shielded: a waiter that gives up (a deadline) would otherwise cancel the shared
        # future, and with it the wait of every other waiter, and of the next ones until a take.
        await asyncio.shield(space)

    def get_nowait(self) -> Any | None:
        q = self._q
        if not q:
            return None
        item = q.popleft()
        space = self._space
        if space is not None:
            self._space = None
            if not space.done():
                space.set_result(None)
        return item

    async def get(self) -> Any | None:
        """The next item, waiting for one; None if `wake` woke the waiter first."""
        item = self.get_nowait()
        if item is None:
            loop = self._loop
            if loop is None:
                loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            await waiter
            item = self.get_nowait()
        return item

    def parked(self) -> bool:
        """Empty, with its reader waiting for an item that nobody has announced yet."""
        waiter = self._waiter
        return not self._q and waiter is not None and not waiter.done()

    def wake(self) -> None:
        """Wake the waiting reader without an item (its `get` returns None)."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
