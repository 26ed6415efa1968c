"""A bounded mailbox for `AsyncDriver`: a deque plus a wake-up future.

Cheaper than a general channel on the hot path (no per-message await when work
is queued), and strictly bounded: `put_nowait` refuses past `capacity`, and the
refusal is the driver's to record."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import msgspec


class MailboxStatistics(msgspec.Struct, frozen=True):
    depth: int
    capacity: int
    puts: int
    refused: int


class Mailbox:
    __slots__ = ("_q", "capacity", "_waiter", "_space", "puts", "refused")

    def __init__(self, capacity: int) -> None:
        assert capacity > 0
        self._q: deque[Any] = deque()
        self.capacity = capacity
        # Bare asyncio futures: the driver runs on anyio's asyncio backend, and a
        # future is the cheapest wake-up there is (this is the per-message path).
        self._waiter: asyncio.Future[None] | None = None
        self._space: asyncio.Future[None] | None = None
        self.puts = 0
        self.refused = 0

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

    async def put(self, item: Any) -> None:
        """Wait for space (external producers get backpressure, not drops)."""
        while len(self._q) >= self.capacity:
            if self._space is None:
                self._space = asyncio.get_running_loop().create_future()
            await self._space
        self.put_nowait(item)

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

    async def get(self) -> Any:
        item = self.get_nowait()
        while item is None:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            item = self.get_nowait()
        return item

    def statistics(self) -> MailboxStatistics:
        return MailboxStatistics(len(self._q), self.capacity, self.puts, self.refused)
