"""AsyncDriver's inline deliveries: a message for an actor whose task is parked on an empty
mailbox runs without waking that task.

- Remote (`AsyncDriver._admit_remote`): in the transport's receive callback; the reply leaves
  before the callback returns, so a round trip costs one turn of the event loop a side, not two.
- Local (`AsyncDriver._enqueue` while a step's outputs are routed): right after the sender's
  step, in the sender's task (`_drain_inline`), up to `burst` deliveries, the chains they start
  included; a local ask and its answer cost no task switch. Only the first message of a step
  to a parked actor goes so: a second one wakes the actor's task, and the first is put in front
  of it (`_to_front`), so a burst is handled in the actor's own loop.

Each actor's order, its mailbox capacity and the log are as with a task hop: the same steps run
(docs/decisions.md, 2026-11-24). `AsyncDriver`'s base class, whose attributes it uses.
"""

from __future__ import annotations

import abc
from collections import deque
from typing import Any

from .cell import Cell, execute, settle_ask
from .driver import DriverBase
from .envelope import Envelope
from .mailbox import Mailbox
from .records import DEAD, LATE


def mailbox_of(cell: Cell) -> Mailbox:
    """An AsyncDriver cell's mailbox, typed: `Cell.mailbox` is driver-specific (Any), and
    compiled code reaches an Any's attributes and methods by name (~300 instructions a call,
    measured); through this it reads the mailbox's C fields."""
    mailbox: Mailbox = cell.mailbox
    return mailbox


class InlineDelivery(DriverBase):
    """DriverBase with deliveries that skip a task switch; `AsyncDriver` is its one subclass."""

    # (declared for readers and type checkers; AsyncDriver.__init__ sets them)
    _inline_q: deque[tuple[Cell, Envelope]]
    inline_deliveries: int
    _stepping: bool
    _pressure: Cell | None
    _held: deque[Any]
    outbox: bool

    # AsyncDriver's, called from here
    @abc.abstractmethod
    def clock(self) -> float:
        ...

    @abc.abstractmethod
    def _report_failure(self, cell: Cell) -> None:
        ...

    @abc.abstractmethod
    def _log_delivery(self, cell: Cell, env: Envelope, now: float, snapshot: bool) -> int:
        ...

    def _drain_inline(self, limit: int) -> int:
        """Run the deliveries queued for parked actors during a step (`_enqueue`), in this
        task, up to `limit` (what they send to parked actors joins the queue); then hand the
        rest to the actors' own tasks, in order. Returns how many ran. A message to an idle
        actor then costs no task switch: a local ask and its answer run in one task."""
        q = self._inline_q
        ran = 0
        while q:
            cell, env = q.popleft()
            cell.inline = 0
            if not cell.alive:
                self._bounce(env, self.clock(), DEAD)
            elif ran < limit and mailbox_of(cell).parked():
                self._run_inline(cell, env)
                ran += 1
            else:  # over the limit, or more came for it since: first in its mailbox
                self._to_front(cell, env)
        return ran

    def _to_front(self, cell: Cell, env: Envelope) -> None:
        """Put `env` at the head of the mailbox (it was sent before what is there) and wake
        the actor's task. It may exceed the capacity by this one message, as a notice does."""
        mailbox = mailbox_of(cell)
        mailbox._q.appendleft(env)
        mailbox.puts += 1
        cell.stats.mailbox_depth += 1
        mailbox.wake()

    def _run_inline(self, cell: Cell, env: Envelope) -> None:
        """Run `env`'s handler here instead of waking the actor's task for it: the steps of
        `_actor_loop`'s body. Only for a cell whose task is parked on an empty mailbox, so
        nothing queued for it is overtaken and its task is not mid-delivery."""
        mailbox_of(cell).puts += 1
        self.inline_deliveries += 1
        now = self.clock()
        if env.reply_to is not None and not settle_ask(cell, env):
            self._bounce(env, now, LATE)
            return
        stats = cell.stats
        failed = stats.failed
        snapshot = execute(cell, env, now)
        self._pressure = None  # no sender to slow down here; the receiver reads on
        outputs = cell.ctx.outputs
        sink = self.sink
        if sink is None:
            if outputs:
                self._stepping = True
                self._route(cell, outputs, now)
                self._stepping = False
        else:
            ticket = self._log_delivery(cell, env, now, snapshot)
            if self.outbox:
                self._held.append((ticket, cell, outputs, now))
            elif outputs:
                self._stepping = True
                self._route(cell, outputs, now)
                self._stepping = False
        if not cell.alive:
            if not self.outbox:
                self._retire(cell, now)
            mailbox_of(cell).wake()  # its task leaves its loop (and drains what came since)
        if stats.failed != failed:
            self._report_failure(cell)
