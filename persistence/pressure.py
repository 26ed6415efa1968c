"""Backpressure shared by both writers: pending-step accounting, the pressure signal
a driver awaits at its edge, and `statistics()`.

`pending` = steps appended but not yet committed (queued, buffered, or inside a
transaction). Three levels, all in steps:
- `high_water` (default max_pending // 2): at or above it the sink is *under
  pressure*; a producer at the edge awaits `wait_for_room()` before admitting more.
- `low_water` (high_water // 2): `wait_for_room()` returns once pending is down to
  it, so an admitted burst refills the queue only halfway (hysteresis).
- `max_pending`: the hard bound. `append` blocks the calling thread there — the
  last resort for traffic that does not pass the edge (actors' own messages): memory
  stays bounded and nothing is lost, but an event loop calling it stalls, which
  `blocked_appends` / `blocked_s` count.
"""

from __future__ import annotations

import abc
import threading
import time

import anyio.to_thread

from .api import SinkStatistics


class Pressure(abc.ABC):
    """Mixed into a sink that has `_lock`, `_ticket` (appended), `_committed`,
    `_error`, `_closing`, and calls `_commit_cond.notify_all()` after each commit."""

    _lock: threading.Lock
    _commit_cond: threading.Condition
    _ticket: int
    _committed: int
    _error: str | None
    _closing: bool

    def _init_pressure(self, max_pending: int, high_water: int | None) -> None:
        high = max(1, max_pending // 2) if high_water is None else high_water
        if not 1 <= high <= max_pending:
            raise ValueError(f"high_water must be in [1, max_pending={max_pending}], not {high}")
        self._max_pending = max_pending
        self._high_water = high
        self._low_water = high // 2
        self._peak_pending = 0
        self._blocked_appends = 0
        self._blocked_s = 0.0

    def _note_pending(self) -> None:
        """Under the lock, after an append."""
        pending = self._ticket - self._committed
        if pending > self._peak_pending:
            self._peak_pending = pending

    def _note_blocked(self, since: float) -> None:
        """Under the lock: an append met the hard bound at `since` (perf_counter)."""
        self._blocked_appends += 1
        self._blocked_s += time.perf_counter() - since

    @property
    def under_pressure(self) -> bool:
        return self._ticket - self._committed >= self._high_water

    async def wait_for_room(self) -> None:
        if not self.under_pressure:
            return
        # The writer signals commits on a threading condition: wait in a worker thread,
        # never on the event loop. Cancelling the caller abandons the wait (it ends at
        # the next commit below low water, or at close).
        await anyio.to_thread.run_sync(self._wait_low_water, abandon_on_cancel=True)

    def _wait_low_water(self) -> None:
        with self._lock:
            self._commit_cond.wait_for(
                lambda: self._ticket - self._committed <= self._low_water
                or self._error is not None
                or self._closing
            )

    def statistics(self) -> SinkStatistics:
        with self._lock:
            return SinkStatistics(
                appended=self._ticket,
                committed=self._committed,
                pending=self._ticket - self._committed,
                peak_pending=self._peak_pending,
                high_water=self._high_water,
                low_water=self._low_water,
                max_pending=self._max_pending,
                transactions=self._transactions(),
                blocked_appends=self._blocked_appends,
                blocked_s=self._blocked_s,
            )

    @abc.abstractmethod
    def _transactions(self) -> int:
        ...
