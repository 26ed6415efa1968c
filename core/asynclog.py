"""What `AsyncDriver`'s deliveries leave in the log, and when their outputs may leave.

- Pages (a sink with `append_page`: the SQLite thread writer's paged layout, the writer process):
  each logged delivery is written as msgpack into the driver's `StepPage` as it is made
  (`core/pagewriter.py`, the bytes msgspec makes of its `Step`), and the page is handed to the
  sink `page_hold_s` after its first step (the sink says how long; a loop callback if no delivery
  comes by then), at `page_steps` steps, and before the driver's final flush. A `Step` per
  delivery (`make_step`, appended one by one, encoded again by the writer thread) was ~12 % of
  the daemon's CPU under `bench http`'s load (py-spy, issue 30 §1). The readable version is
  that one, `make_step` + `append`: tests/core/test_asynclog.py logs the same deliveries both
  ways and compares the logs step by step.
- Steps (every other sink, and `outbox`): `make_step` and `append`, one ticket a step.
- Outbox (`outbox=True`): an actor's outputs are held until the store reports the step's
  commit (`_release`), so a `kill -9` never loses a message another process already saw.

`AsyncDriver`'s base class (asyncdriver.py).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

import structlog

from .asynctimers import WallTimers
from .cell import Cell
from .context import Out
from .envelope import Envelope
from .records import Step
from .steps import StepPage, make_step

log = structlog.get_logger("deepserve.kernel")


class LoggedDelivery(WallTimers):
    """The log side of `AsyncDriver`; its `__init__` calls `_init_log`."""

    outbox: bool
    _held: deque[tuple[int, Cell, list[Out], float]]
    _committed: asyncio.Event | None  # outbox: set when the store commits
    _committed_upto: int
    _page: StepPage | None  # deliveries encoded since the last hand-over (a paging sink)
    _append_page: Callable[[bytes, int, float, float], int] | None
    _page_steps: int
    _page_hold_s: float
    _page_opened: float  # the clock when the page's first step was written
    _page_handle: asyncio.Handle | None  # the hand-over callback armed for the open page
    pages_handed: int

    def _init_log(self, outbox: bool) -> None:
        sink = self.sink
        if outbox and not hasattr(sink, "on_commit"):
            raise ValueError("outbox durability needs a sink that reports commits (a DurableSink)")
        self.outbox = outbox
        self._held = deque()
        self._committed = None
        self._committed_upto = -1
        append_page = None if outbox else getattr(sink, "append_page", None)
        self._append_page = append_page
        self._page = None if append_page is None else StepPage()
        self._page_steps = int(getattr(sink, "page_steps", 1))
        self._page_hold_s = float(getattr(sink, "page_hold_s", 0.0))
        self._page_opened = 0.0
        self._page_handle = None
        self.pages_handed = 0

    # ---- logging a step --------------------------------------------------------------
    def _log_delivery(self, cell: Cell, env: Envelope, now: float, snapshot: bool) -> int:
        """Log the delivery `execute` just made; returns its ticket (0 when paged: no outbox)."""
        page = self._page
        if page is None:
            return self.sink.append(make_step(cell, env, now, snapshot))  # type: ignore[union-attr]
        self._paged(page.add_delivery(cell, env, now, snapshot), now)
        return 0

    def _log(self, step: Step) -> None:
        """A record that is not a delivery (a dead letter, a final snapshot), in order with them."""
        page = self._page
        if page is None:
            self.sink.append(step)  # type: ignore[union-attr]
            return
        self._paged(page.add(step), self.clock())

    def _paged(self, steps: int, now: float) -> None:
        if steps == 1:
            self._page_opened = now
            if self._page_handle is None and self._loop is not None:
                self._page_handle = self._loop.call_later(self._page_hold_s, self._page_due)
        elif steps >= self._page_steps or now - self._page_opened >= self._page_hold_s:
            self._hand_page()

    def _hand_page(self) -> None:
        page = self._page
        append_page = self._append_page
        if page is None or append_page is None or not page.steps:
            return
        steps, t_first, t_last = page.steps, page.t_first, page.t_last
        self.pages_handed += 1
        append_page(page.take(), steps, t_first, t_last)

    def _page_due(self) -> None:
        """The loop callback armed when a page opened: hands it over unless a delivery did (then
        it waits for the page opened since, if any, to be as old)."""
        self._page_handle = None
        page, loop = self._page, self._loop
        if page is None or not page.steps:
            return
        left = self._page_opened + self._page_hold_s - self.clock()
        if left > 0.001 and loop is not None:
            self._page_handle = loop.call_later(left, self._page_due)
            return
        try:
            self._hand_page()
        except Exception as exc:  # noqa: BLE001 — a failed sink: the next step's hand-over raises it in an actor's task
            log.warning("the log writer refused a page", error=str(exc))

    def _flush_log(self) -> None:
        """Hand the open page over and wait until the sink has committed everything."""
        handle = self._page_handle
        if handle is not None:
            handle.cancel()
            self._page_handle = None
        self._hand_page()
        if self.sink is not None:
            self.sink.flush()

    # ---- outbox ------------------------------------------------------------------
    def _start_outbox(self) -> None:
        self._committed = asyncio.Event()
        self.sink.on_commit = self._committed_threadsafe  # type: ignore[union-attr]

    def _committed_threadsafe(self, upto: int) -> None:
        self._loop.call_soon_threadsafe(self._note_commit, upto)  # type: ignore[union-attr]

    def _note_commit(self, upto: int) -> None:
        if upto > self._committed_upto:
            self._committed_upto = upto
        self._committed.set()  # type: ignore[union-attr]

    async def _releaser(self) -> None:
        """Routes what the store has committed, in a task of the driver's group: a released
        step may spawn a child (`_start_cell` starts a task), which a bare loop callback
        cannot (anyio: no async context; the child never started and `idle()` hung)."""
        committed = self._committed
        assert committed is not None
        while True:
            await committed.wait()
            committed.clear()
            self._release(self._committed_upto)

    def _release(self, upto: int) -> None:
        held = self._held
        while held and held[0][0] <= upto:
            _, cell, outputs, now = held.popleft()
            self._route(cell, outputs, now)
            if not cell.alive:
                self._retire(cell, now)


__all__ = ["LoggedDelivery"]
