"""`AsyncDriver`: the same actors under anyio, on the wall clock.

One task per actor drains a bounded mailbox; one more task fires timers. With
`outbox=True`, an actor's outputs are held until the event store reports the
records that produced them committed, so a `kill -9` never loses a message that
another process already saw. Runs on anyio's asyncio backend.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from heapq import heappop, heappush
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup

from .address import EXTERNAL_PREFIX, hlc_tick
from .cell import Cell, execute, make_step
from .context import Out
from .driver import DriverBase
from .envelope import Envelope
from .mailbox import Mailbox
from .messages import AskFailed, HandlerFailed, Message, Stop, Stopped
from .records import DEAD, FULL, LogSink
from .transport import Transport

log = structlog.get_logger("deepserve.kernel")


class AskError(Exception):
    """An external `ask` failed: the target is dead, its mailbox full, or it timed out."""


class AsyncDriver(DriverBase):
    mode = "daemon"

    def __init__(
        self,
        seed: int = 0,
        sink: LogSink | None = None,
        mailbox_capacity: int = 1024,
        transport: Transport | None = None,
        outbox: bool = False,
        epoch: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(seed, sink=sink, mailbox_capacity=mailbox_capacity, **kwargs)
        assert not outbox or sink is not None, "outbox durability needs a sink"
        self.transport = transport
        self.outbox = outbox
        # Wall-clock instant that is t=0 for ctx.now(). Processes of one run share it,
        # so their clocks (and HLCs) are comparable when their logs are merged.
        self.epoch = epoch
        self._tg: TaskGroup | None = None
        self._t0 = 0.0
        self._timers: dict[tuple[str, str], int] = {}
        self._timer_heap: list[tuple[float, int, Envelope, str]] = []
        self._timer_seq = 0
        self._timer_wake = anyio.Event()
        self._held: deque[tuple[int, Cell, list[Out], float]] = deque()
        self._waiters: dict[int, list[Any]] = {}  # ext ask id -> [event, reply]
        self._busy = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pressure: Cell | None = None
        # Deliveries an actor makes before yielding to the others.
        self.burst = 64
        # A sender that filled a mailbox past half waits this many yields at most:
        # pressure, never a deadlock (two actors flooding each other still progress).
        self.max_backpressure_yields = 10_000

    # ---- lifecycle ---------------------------------------------------------
    async def __aenter__(self) -> AsyncDriver:
        wall, mono = time.time(), time.monotonic()
        if self.epoch is None:
            self.epoch = wall
        # Monotonic from here on, offset so that t counts from the shared epoch.
        self._t0 = mono - (wall - self.epoch)
        self._loop = asyncio.get_running_loop()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._timer_loop)
        if self.transport is not None:
            self.transport.attach(self._deliver_remote)
        if self.outbox:
            self.sink.on_commit = self._committed_threadsafe  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        result = await self._tg.__aexit__(*exc)
        self._snapshot_live(self.clock())
        if self.transport is not None:
            self.transport.close()
        if self.sink is not None:
            self.sink.flush()
        return result

    def clock(self) -> float:
        return time.monotonic() - self._t0

    # ---- the outside world ---------------------------------------------------
    def spawn(self, addr: str, cls: type, *, src: str = "ext/operator", **kwargs: Any) -> str:
        env = self._spawn_env(addr, cls, kwargs, src, self.clock())
        self._start_cell(env)
        return addr

    def inject_nowait(
        self, dst: str, msg: Message, *, corr: str | None = None, src: str = "ext/input"
    ) -> int:
        """External input; a full mailbox is recorded and reported as 0."""
        env = self._external_env(dst, msg, corr, src, self.clock())
        return env.msg_id if self._send(env) else 0

    async def inject(
        self, dst: str, msg: Message, *, corr: str | None = None, src: str = "ext/input"
    ) -> int:
        """External input with backpressure: waits for mailbox space."""
        env = self._external_env(dst, msg, corr, src, self.clock())
        cell = self.cells.get(dst)
        if cell is not None and cell.alive:
            await cell.mailbox.put(env)
            cell.stats.mailbox_depth += 1
            return env.msg_id
        return env.msg_id if self._send(env) else 0

    async def ask(self, dst: str, msg: Message, timeout_s: float, corr: str | None = None) -> Any:
        """Request/reply from outside the actor system."""
        env = self._external_env(dst, msg, corr, "ext/ask", self.clock(), ask=True)
        slot: list[Any] = [anyio.Event(), None]
        self._waiters[env.msg_id] = slot
        try:
            self._send(env)
            with anyio.fail_after(timeout_s):
                await slot[0].wait()
        except TimeoutError:
            raise AskError(f"ask {type(msg).__name__} to {dst} timed out after {timeout_s}s") from None
        finally:
            self._waiters.pop(env.msg_id, None)
        reply = slot[1]
        if isinstance(reply, AskFailed):
            raise AskError(f"ask {type(msg).__name__} to {dst} failed: {reply.reason}")
        return reply

    async def idle(self, poll_s: float = 0.001) -> None:
        """Wait until no mailbox holds a message and no output is held."""
        while self._busy or self._held or any(c.stats.mailbox_depth for c in self.cells.values()):
            await anyio.sleep(poll_s)

    # ---- actor tasks -----------------------------------------------------------
    def _start_cell(self, env: Envelope) -> None:
        existing = self.cells.get(env.dst)
        if existing is not None and existing.alive:
            self._undeliverable(env, self.clock(), DEAD)
            return
        cell = self._new_cell(env.dst)
        cell.mailbox = Mailbox(self.mailbox_capacity)
        cell.mailbox.put_nowait(env)
        cell.stats.mailbox_depth += 1
        assert self._tg is not None, "use the driver inside 'async with'"
        self._tg.start_soon(self._actor_loop, cell, name=f"actor {cell.addr}")

    async def _actor_loop(self, cell: Cell) -> None:
        mailbox = cell.mailbox
        sink = self.sink
        stats = cell.stats
        burst = failed = 0
        while cell.alive:
            env = mailbox.get_nowait()
            if env is None:
                env = await mailbox.get()
                burst = 0
            stats.mailbox_depth -= 1
            self._busy += 1
            now = self.clock()
            snapshot = execute(cell, env, now)
            self._pressure = None
            ticket = sink.append(make_step(cell, env, now, snapshot)) if sink is not None else 0
            if self.outbox:  # released by `_release` once the store reports the commit
                self._held.append((ticket, cell, cell.ctx.outputs, now))
            else:
                self._route(cell, cell.ctx.outputs, now)
                if not cell.alive:
                    self._retire(cell, now)
            self._busy -= 1
            if stats.failed != failed:
                failed = stats.failed
                self._report_failure(cell)
            burst += 1
            if self._pressure is not None or burst >= self.burst:
                # Fairness and backpressure: let other actors (and the receiver we
                # just filled past its high-water mark) run before we go on.
                burst = 0
                await self._yield_to(self._pressure)
        self._drain_dead(cell)

    async def _yield_to(self, target: Cell | None) -> None:
        await anyio.lowlevel.checkpoint()
        high_water = self.mailbox_capacity // 2
        for _ in range(self.max_backpressure_yields):
            if target is None or target.stats.mailbox_depth <= high_water or not target.alive:
                return
            await anyio.lowlevel.checkpoint()

    def _drain_dead(self, cell: Cell) -> None:
        while (env := cell.mailbox.get_nowait()) is not None:
            cell.stats.mailbox_depth -= 1
            self._bounce(env, DEAD)

    # ---- outbox ------------------------------------------------------------------
    def _committed_threadsafe(self, upto: int) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._release, upto)

    def _release(self, upto: int) -> None:
        held = self._held
        while held and held[0][0] <= upto:
            _, cell, outputs, now = held.popleft()
            self._route(cell, outputs, now)
            if not cell.alive:
                self._retire(cell, now)

    # ---- routing -------------------------------------------------------------------
    def _route(self, cell: Cell, outputs: list[Out], now: float) -> None:
        addr = cell.addr
        hlc = cell.hlc
        for o in outputs:
            hlc = hlc_tick(hlc, now)
            kind = o.kind
            if kind == 0:
                self._send(Envelope(addr, o.dst, o.msg_id, hlc, o.corr, o.msg, o.reply_to, o.ask))
            elif kind == 1:
                env = Envelope(addr, addr, o.msg_id, hlc, o.corr, o.msg)
                self._set_timer(now + o.delay, env, o.key)  # type: ignore[arg-type]
            elif kind == 2:
                self._timers.pop((addr, o.key), None)  # type: ignore[arg-type]
            elif kind == 3:
                self._start_cell(Envelope(addr, o.dst, o.msg_id, hlc, o.corr, o.msg))
            else:
                self._send(Envelope(addr, o.dst, o.msg_id, hlc, o.corr, Stop(by=addr)))
        cell.hlc = hlc

    def _send(self, env: Envelope) -> bool:
        dst = env.dst
        if dst.startswith(EXTERNAL_PREFIX):
            self._to_outside_async(env)
            return True
        cell = self.cells.get(dst)
        if cell is not None and cell.alive:
            if not cell.mailbox.put_nowait(env):
                cell.stats.mailbox_full += 1
                self._bounce(env, FULL)
                return False
            depth = cell.stats.mailbox_depth = cell.stats.mailbox_depth + 1
            if depth > self.mailbox_capacity // 2:
                self._pressure = cell
            return True
        if cell is None and self.transport is not None and self.transport.owns(dst):
            if self.transport.send(env):
                return True
            # The peer is gone or far behind: a dead letter like any other.
            self._bounce(env, DEAD, "transport refused")
            return False
        self._bounce(env, DEAD)
        return False

    def _bounce(self, env: Envelope, kind: int, reason: str | None = None) -> None:
        fail = self._undeliverable(env, self.clock(), kind, reason)
        if fail is not None:
            self._send(fail)

    def _to_outside_async(self, env: Envelope) -> None:
        if env.reply_to is not None:
            slot = self._waiters.get(env.reply_to)
            if slot is not None:
                slot[1] = env.msg
                slot[0].set()
                return
        self._to_outside(self.clock(), env)

    def _report_failure(self, cell: Cell) -> None:
        """The log has the failure already; an operator watching a daemon sees it too."""
        self._note_stop(cell)
        for event in cell.ctx.events:
            if isinstance(event, HandlerFailed):
                log.warning("handler failed", actor=cell.addr, seq=cell.seq, error=event.error)
            elif isinstance(event, Stopped):
                log.warning("actor stopped", actor=cell.addr, seq=cell.seq, reason=event.reason)

    def _retire(self, cell: Cell, t: float) -> None:
        super()._retire(cell, t)
        for env in self._pending_timers(cell.addr, self._timer_heap, self._timers):  # type: ignore[arg-type]
            self._bounce(env, DEAD)

    def _deliver_remote(self, env: Envelope) -> None:
        self._send(env)

    # ---- timers --------------------------------------------------------------------
    def _set_timer(self, deadline: float, env: Envelope, key: str) -> None:
        self._timer_seq += 1
        self._timers[(env.dst, key)] = self._timer_seq
        heap = self._timer_heap
        if not heap or deadline < heap[0][0]:
            self._timer_wake.set()
        heappush(heap, (deadline, self._timer_seq, env, key))

    async def _timer_loop(self) -> None:
        heap = self._timer_heap
        while True:
            self._timer_wake = anyio.Event()
            if not heap:
                await self._timer_wake.wait()
                continue
            delay = heap[0][0] - self.clock()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._timer_wake.wait()
                continue
            _, seq, env, key = heappop(heap)
            if self._timers.get((env.dst, key)) == seq:
                del self._timers[(env.dst, key)]
                self._send(env)



def run(main: Any, *args: Any) -> Any:
    """Run an async entry point on anyio's asyncio backend, with uvloop when present
    (its loop roughly halves the per-message scheduling cost; see docs/decisions.md)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return anyio.run(main, *args)
    return anyio.run(main, *args, backend_options={"use_uvloop": True})


__all__ = ["AskError", "AsyncDriver", "run"]
