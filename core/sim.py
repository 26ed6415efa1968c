"""`SimDriver`: a discrete-event loop on a virtual clock.

One heap of (time, seq, envelope, timer key) pending deliveries; one delivery at a
time; time jumps to the next one. Same seed and same external inputs give the same
log, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

from .address import EXTERNAL_PREFIX, hlc_tick
from .cell import Cell, execute, make_step
from .driver import DriverBase
from .envelope import Envelope
from .messages import Message, Started, Stop
from .records import DEAD, FULL, OutputRec

Invariant = Callable[["SimDriver"], None]


class SimDriver(DriverBase):
    mode = "sim"

    def __init__(self, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(seed, **kwargs)
        self.now = 0.0
        self._heap: list[tuple[float, int, Envelope, str | None]] = []
        self._seq = 0
        self._timers: dict[tuple[str, str], int] = {}
        self.deliveries = 0
        self.invariants: list[Invariant] = []
        self._depth: dict[str, int] = {}  # due, undelivered non-timer messages per address
        # External inputs scheduled for later: the outside world's, not yet in any
        # mailbox. They enter the heap (and count against the target's capacity)
        # only when virtual time reaches them, so a whole trace injected up front
        # does not make mailboxes read as full.
        self._scheduled: list[tuple[float, int, Envelope, str | None]] = []

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

    def pending(self) -> int:
        """Deliveries not yet made: due messages, timers and scheduled inputs."""
        return len(self._heap) + len(self._scheduled)

    def _next_time(self) -> float:
        """Virtual time of the next delivery (inf when nothing is pending)."""
        heap_t = self._heap[0][0] if self._heap else float("inf")
        return min(heap_t, self._scheduled[0][0]) if self._scheduled else heap_t

    def _admit_due(self) -> None:
        """Move scheduled external inputs whose time has come into the heap."""
        sched, heap, depth = self._scheduled, self._heap, self._depth
        t = sched[0][0] if not heap or sched[0][0] < heap[0][0] else heap[0][0]
        while sched and sched[0][0] <= t:
            item = heappop(sched)
            dst = item[2].dst
            depth[dst] = depth.get(dst, 0) + 1
            heappush(heap, item)

    # ---- the loop ----------------------------------------------------------
    def run(self, until: float | None = None, max_deliveries: int | None = None) -> int:
        """Deliver until the heap is empty, virtual time passes `until`, or the
        delivery budget is spent. Returns the number of deliveries made."""
        heap, cells, timers, sink, depth = self._heap, self.cells, self._timers, self.sink, self._depth
        sched = self._scheduled
        invariants = self.invariants
        budget = -1 if max_deliveries is None else max_deliveries
        n = 0
        while n != budget:
            if sched and (not heap or sched[0][0] <= heap[0][0]):
                if until is not None and sched[0][0] > until:
                    break
                self._admit_due()
            elif not heap or (until is not None and heap[0][0] > until):
                break
            t, seq, env, key = heappop(heap)
            if key is not None:
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
            snapshot = execute(cell, env, t)
            if sink is not None:
                step = make_step(cell, env, t, snapshot)
                sink.append(step)
                if step.outputs:
                    self._route(cell, t, step.outputs)
            elif cell.ctx.outputs:
                self._route(cell, t, None)
            if not cell.alive:
                self._retire(cell, t)
                self._note_stop(cell)
            n += 1
            for check in invariants:
                check(self)
        if until is not None and self._next_time() > until:
            self.now = max(self.now, until)
        self.deliveries += n
        if not heap and not sched:
            self.snapshot_live()  # the run has ended: nothing is pending
        return n

    def snapshot_live(self) -> None:
        """Log every live actor's final state now (done by `run` when nothing is
        pending; call it after a run stopped early by `until` or a budget)."""
        self._snapshot_live(self.now)

    # ---- routing -------------------------------------------------------------
    def _push(self, t: float, env: Envelope, key: str | None = None) -> int:
        if key is None:
            self._depth[env.dst] = self._depth.get(env.dst, 0) + 1
        self._seq += 1
        heappush(self._heap, (t, self._seq, env, key))
        return self._seq

    def _send(self, env: Envelope, t: float) -> None:
        dst = env.dst
        if dst.startswith(EXTERNAL_PREFIX):
            self._to_outside(t, env)
            return
        if self._depth.get(dst, 0) >= self.mailbox_capacity:
            cell = self.cells.get(dst)
            if cell is not None:
                cell.stats.mailbox_full += 1
            self._bounce(env, t, FULL)
            return
        self._push(t, env)

    def _bounce(self, env: Envelope, t: float, kind: int) -> None:
        fail = self._undeliverable(env, t, kind)
        if fail is not None:
            self._send(fail, t)

    def _route(self, cell: Cell, t: float, recs: list[OutputRec] | None) -> None:
        addr = cell.addr
        hlc = cell.hlc
        for i, o in enumerate(cell.ctx.outputs):
            hlc = hlc_tick(hlc, t)
            kind = o.kind
            if kind == 0:  # send; reuse the logged encoding for the receiver's input record
                payload = recs[i].payload if recs is not None else None
                env = Envelope(addr, o.dst, o.msg_id, hlc, o.corr, o.msg, o.reply_to, o.ask, False, payload)
                self._send(env, t)
            elif kind == 1:  # timer
                env = Envelope(addr, addr, o.msg_id, hlc, o.corr, o.msg)
                self._timers[(addr, o.key)] = self._push(t + o.delay, env, o.key)
            elif kind == 2:  # cancel
                self._timers.pop((addr, o.key), None)
            elif kind == 3:  # spawn: the child's cell is made when `Started` arrives
                self._push(t, Envelope(addr, o.dst, o.msg_id, hlc, o.corr, o.msg))
            else:  # stop another actor
                self._send(Envelope(addr, o.dst, o.msg_id, hlc, o.corr, Stop(by=addr)), t)
        cell.hlc = hlc

    def _retire(self, cell: Cell, t: float) -> None:
        super()._retire(cell, t)
        for env in self._pending_timers(cell.addr, self._heap, self._timers):
            self._bounce(env, t, DEAD)

    def stats(self) -> dict[str, dict[str, Any]]:
        for addr, cell in self.cells.items():
            cell.stats.mailbox_depth = self._depth.get(addr, 0)
        return super().stats()
