"""`AsyncDriver`'s side of a transport: envelopes from peers, and flow control over a transport
that offers it (`attach_admit`, `congestion`, `aclose`; adapters/zmq). A remote envelope for an
idle actor runs in the transport's receive callback (`_run_inline`); one for a mailbox past its
high-water mark waits (the transport stops reading its socket meanwhile). `AsyncDriver`'s base
class (asyncdriver.py), whose attributes it uses.
"""

from __future__ import annotations

from typing import Any

import anyio

from .asynclog import LoggedDelivery
from .cell import Cell
from .envelope import Envelope
from .inline import mailbox_of
from .records import DEAD
from .transport import Transport


class RemoteFlow(LoggedDelivery):
    """(`AsyncDriver.__init__` sets these; see there.)"""

    transport: Transport | None
    max_remote_wait_s: float
    _flow: Any
    _remote_pressure: Any
    inline_remote: bool
    _high_water: int

    def _deliver_remote(self, env: Envelope) -> None:
        self._send(env, self.clock())

    def _admit_remote(self, env: Envelope) -> Any:
        """Deliver now, or return an awaitable that delivers once the mailbox is
        below its high-water mark: the transport stops reading its socket meanwhile.

        Runs in the transport's receive callback, where an exception (the log refusing the
        step) would only be logged by the event loop: it fails the driver instead, as it
        would in an actor's task (`_fail_in_task`; an actor's own failure never gets here,
        `execute` records it)."""
        try:
            cell = self.cells.get(env.dst)
            if cell is not None and cell.alive:
                if cell.stats.mailbox_depth >= self._high_water:
                    return self._admit_later(cell, env)
                if self.inline_remote and mailbox_of(cell).parked() and self._remote_pressure is None:
                    self._run_inline(cell, env)
                    if self._inline_q:
                        self._drain_inline(self.burst)
                    return None
            self._send(env, self.clock())
        except Exception as exc:  # noqa: BLE001 — re-raised in a task of the driver
            self._fail_in_task(exc)
        return None

    async def _admit_later(self, cell: Cell, env: Envelope) -> None:
        """Wait, at most `max_remote_wait_s`, until the actor has taken enough of its mailbox,
        then send (still full: recorded like any full mailbox). Runs in the transport's task."""
        mailbox = mailbox_of(cell)
        with anyio.move_on_after(self.max_remote_wait_s):
            # An empty mailbox ends the wait too: no take would come to wake it (the mark is 0
            # at `mailbox_capacity` 1), and it cannot be emptier.
            while cell.alive and len(mailbox) and cell.stats.mailbox_depth >= self._high_water:
                # Woken by the actor's next take, or by the drain of its mailbox when it stops.
                # Not a poll: uvloop rounds a sub-millisecond sleep to 0 ms, and the loop spun
                # for as long as the mailbox stayed full.
                await mailbox.taken()
        try:
            self._send(env, self.clock())
        except Exception as exc:  # noqa: BLE001 — the transport's task, which nobody awaits
            self._fail_in_task(exc)

    async def _wait_remote(self) -> None:
        room, self._remote_pressure = self._remote_pressure, None
        with anyio.move_on_after(self.max_remote_wait_s):
            await room.wait()

    async def _close_transport(self) -> None:
        """Flush and wait for acks; what a peer never acknowledged is a dead letter."""
        transport = self.transport
        if transport is None:
            return
        if self._flow is None:
            transport.close()
            return
        with anyio.CancelScope(shield=True):
            left = await self._flow.aclose()
        for env in left:
            self._undeliverable(env, self.clock(), DEAD, "peer did not acknowledge before close")


__all__ = ["RemoteFlow"]
