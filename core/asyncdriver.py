"""`AsyncDriver`: the same actors under anyio, on the wall clock.

One task per actor drains a bounded mailbox; timers fire from an event-loop callback
(asynctimers.py); what a delivery leaves in the log, and the outbox (`outbox=True`: an actor's
outputs held until the event store reports the records that produced them committed, so a
`kill -9` never loses a message that another process already saw), are asynclog.py's. Here:
the lifecycle, the outside world's inputs and asks, the actor loop, routing and a transport's
flow control. Runs on anyio's asyncio backend.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Final

import anyio
import structlog
from anyio.abc import TaskGroup

from .asyncremote import RemoteFlow
from .asynctimers import TIMER_HEAP_SLACK
from .cell import Cell, execute, settle_ask
from .context import timeout_reason
from .driver import ASK_SRC, TRANSPORT_REFUSED, AskError
from .envelope import Envelope
from .inline import mailbox_of
from .mailbox import Mailbox
from .messages import HandlerFailed, Message, Stopped
from .records import DEAD, FULL, LATE, LogSink
from .transport import Transport

log = structlog.get_logger("deepserve.kernel")
_monotonic: Final = time.monotonic


class AsyncDriver(RemoteFlow):
    mode = "daemon"

    def __init__(
        self,
        seed: int = 0,
        sink: LogSink | None = None,
        mailbox_capacity: int = 1024,
        transport: Transport | None = None,
        outbox: bool = False,
        epoch: float | None = None,
        run_id: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        # (the base's arguments spelled out, not `**kwargs`: see SimDriver.__init__)
        super().__init__(seed, sink, mailbox_capacity, run_id, config)
        self._init_timers()
        self._init_log(outbox)  # (before anything is logged)
        self.transport = transport
        # Wall-clock instant that is t=0 for ctx.now(). Processes of one run share it,
        # so their clocks (and HLCs) are comparable when their logs are merged.
        self.epoch = epoch
        self._tg: TaskGroup | None = None
        self._t0 = 0.0
        self._pressure: Cell | None = None
        # Overload: external inputs are admitted while the target's mailbox holds
        # fewer than `edge_limit` messages and the sink is not under pressure (a
        # sink may offer `under_pressure` and `await wait_for_room()`: the
        # `PressureSink` of persistence/api.py).
        self.edge_limit = max(1, mailbox_capacity // 2)
        self._high_water = mailbox_capacity // 2
        self.refused = 0
        self._pressure_sink: Any = sink if hasattr(sink, "wait_for_room") else None
        # Deliveries an actor makes before yielding to the others.
        self.burst = 64
        # A sender that filled a mailbox past half waits this many yields at most:
        # pressure, never a deadlock (two actors flooding each other still progress).
        self.max_backpressure_yields = 10_000
        # Flow control over a transport that offers it (`attach_admit`, `congestion`,
        # `aclose`; adapters/zmq): a sender whose peer is behind waits this long at
        # most per handler, and so does a remote envelope for a mailbox past half.
        self.max_remote_wait_s = 5.0
        self._flow = None
        self._remote_pressure = None
        # A remote envelope for an idle actor runs in the receive callback (`_run_inline`).
        self.inline_remote = True
        # ... and one for an idle local actor runs after the sender's step, in the sender's
        # task (`_drain_inline`). Both keep each actor's order; `inline_deliveries` counts.
        self.inline_local = True
        self.inline_deliveries = 0
        self._stepping = False  # routing a step's outputs (only then may `_enqueue` queue inline)
        self._inline_q: deque[tuple[Cell, Envelope]] = deque()

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
        self._start_timers()
        if self.transport is not None:
            if hasattr(self.transport, "attach_admit"):
                self._flow = self.transport
                self.transport.attach_admit(self._admit_remote)
            else:
                self.transport.attach(self._deliver_remote)
        if self.outbox:
            self._start_outbox()
            self._tg.start_soon(self._releaser)
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        if self._tg is None:
            raise RuntimeError("AsyncDriver.__aexit__ without __aenter__")
        self._tg.cancel_scope.cancel()
        self._stop_timers()
        try:
            result = await self._tg.__aexit__(*exc)
        except Exception as failure:
            # The run failed (a kernel failure re-raised in the group): the steps up to it are
            # the incident's record, and the open log page holds the last of them. Close as a
            # clean exit does before the failure propagates; a second failure while closing
            # (the sink that failed the run, refusing again) is noted on the first, not raised.
            try:
                await self._close()
            except Exception as again:  # noqa: BLE001 — the run's own failure is the one raised
                failure.add_note(f"closing the driver after that failed too: {again!r}")
            raise
        await self._close()
        return result

    async def _close(self) -> None:
        """Final snapshots, the transport flushed and closed, every logged step committed."""
        self._snapshot_live(self.clock())
        if self.transport is not None:
            await self._close_transport()
        self._flush_log()

    def clock(self) -> float:
        return _monotonic() - self._t0

    # ---- the outside world ---------------------------------------------------
    def spawn(self, addr: str, cls: type, *, src: str = "ext/operator", **kwargs: Any) -> str:
        t = self.clock()
        self._start_cell(self._spawn_env(addr, cls, kwargs, src, t), t)
        return addr

    def inject_nowait(
        self, dst: str, msg: Message, *, corr: str | None = None, src: str = "ext/input"
    ) -> int:
        """External input, or 0 if refused: the node sheds load at its edge. Refused
        while the target's mailbox holds `edge_limit` messages (recorded as a
        drop, `kind = full`) or while the sink is under pressure (counted in `refused`,
        not logged: the log is what is behind)."""
        env_t = self.clock()
        env = self._external_env(dst, msg, corr, src, env_t)
        if self._sink_saturated():
            self.refused += 1
            return 0
        cell = self.cells.get(dst)
        if cell is not None and cell.alive and len(cell.mailbox) >= self.edge_limit:
            cell.stats.mailbox_full += 1
            self.refused += 1
            self._bounce(env, env_t, FULL)
            return 0
        return env.msg_id if self._send(env, env_t) else 0

    async def inject(
        self, dst: str, msg: Message, *, corr: str | None = None, src: str = "ext/input"
    ) -> int:
        """External input with backpressure: waits while the target's mailbox holds
        `edge_limit` messages or the sink is under pressure. The rest of the mailbox is
        kept for messages between actors, which are never made to wait."""
        sink = self._pressure_sink
        if sink is not None and sink.under_pressure:
            await sink.wait_for_room()
        cell = self.cells.get(dst)
        if cell is not None and cell.alive:
            await cell.mailbox.wait_below(self.edge_limit)
        t = self.clock()
        env = self._external_env(dst, msg, corr, src, t)
        return env.msg_id if self._send(env, t) else 0

    def _sink_saturated(self) -> bool:
        sink = self._pressure_sink
        return sink is not None and bool(sink.under_pressure)

    async def ask(self, dst: str, msg: Message, timeout_s: float, corr: str | None = None) -> Any:
        """Request/reply from outside the actor system. Returns the reply; raises
        `AskError` (request id, target, reason) if the target is dead, its mailbox
        full, the transport refused, or no answer came within `timeout_s`. A reply
        after the timeout is recorded (input kind `late`), not delivered."""
        if not timeout_s > 0:
            raise ValueError(f"ask needs a positive timeout_s, got {timeout_s!r}")
        t = self.clock()
        env = self._external_env(dst, msg, corr, ASK_SRC, t, ask=True)
        rid = env.msg_id
        slot: list[Any] = [anyio.Event(), None]
        self._waiters[rid] = slot
        try:
            self._send(env, t)
            with anyio.move_on_after(timeout_s):
                await slot[0].wait()
        finally:
            del self._waiters[rid]
        if not slot[0].is_set():
            raise AskError(rid, dst, timeout_reason(timeout_s))
        return self._ask_result(rid, dst, slot[1])

    def _answer(self, slot: list[Any], msg: Any) -> None:
        slot[1] = msg
        slot[0].set()

    async def idle(self, poll_s: float = 0.001, *, timers: bool = False) -> None:
        """Wait until no mailbox holds a message, no handler runs and no output is
        held for a commit. Pending timers do not count (a periodic timer would
        never let it return) unless `timers=True`: then it also waits until no
        timer is pending. Messages in flight on a transport are not seen."""
        # A handler runs and its outputs are routed without an await in between, so
        # no handler is ever running when this coroutine looks.
        while (
            self._held or any(c.stats.mailbox_depth for c in self.cells.values())
            or (timers and self._timers)
        ):
            await anyio.sleep(poll_s)

    # ---- actor tasks -----------------------------------------------------------
    def _start_cell(self, env: Envelope, t: float) -> None:
        existing = self.cells.get(env.dst)
        if existing is not None and existing.alive:
            self._bounce(env, t, DEAD)  # the address is taken by a live actor
            return
        cell = self._new_cell(env.dst)
        cell.mailbox = Mailbox(self.mailbox_capacity, self._loop)
        cell.mailbox.put_nowait(env)
        cell.stats.mailbox_depth += 1
        if self._tg is None:
            raise RuntimeError("use AsyncDriver inside 'async with' before spawning")
        self._tg.start_soon(self._actor_loop, cell, name=f"actor {cell.addr}")

    async def _actor_loop(self, cell: Cell) -> None:
        mailbox = mailbox_of(cell)
        queue = mailbox._q
        sink = self.sink
        stats = cell.stats
        ctx = cell.ctx
        monotonic, t0 = _monotonic, self._t0
        burst = failed = 0
        while cell.alive:
            # `env` typed: the mailbox holds Any, and compiled code reads an Any's fields by name
            if queue and mailbox._space is None:  # get_nowait, inlined
                env: Envelope = queue.popleft()
            else:
                got = mailbox.get_nowait()
                if got is None:
                    got = await mailbox.get()
                    burst = 0
                    if got is None:  # woken empty: an inline delivery stopped the cell
                        continue
                env = got
            stats.mailbox_depth -= 1
            now = monotonic() - t0  # self.clock(), inlined
            if env.reply_to is not None and not settle_ask(cell, env):
                self._bounce(env, now, LATE)
                continue
            snapshot = execute(cell, env, now)
            self._clear_pressure()
            outputs = ctx.outputs
            if sink is None:
                if outputs:
                    self._stepping = True  # `_enqueue` may queue for a parked actor (`_drain_inline`)
                    self._route(cell, outputs, now)
                    self._stepping = False
            else:
                ticket = self._log_delivery(cell, env, now, snapshot)
                if self.outbox:  # released by `_release` once the store reports the commit
                    self._held.append((ticket, cell, outputs, now))
                elif outputs:
                    self._stepping = True
                    self._route(cell, outputs, now)
                    self._stepping = False
            if not cell.alive and not self.outbox:
                self._retire(cell, now)
            if stats.failed != failed:
                failed = stats.failed
                self._report_failure(cell)
            burst += 1
            if self._inline_q:
                burst += self._drain_inline(self.burst)
            if self._pressure is not None or burst >= self.burst or self._remote_pressure is not None:
                # Fairness and backpressure: let other actors (and the receiver we
                # just filled past its high-water mark) run before we go on.
                burst = 0
                await self._yield_to(self._pressure)
                if self._remote_pressure is not None:
                    await self._wait_remote()
        self._drain_dead(cell)

    def _clear_pressure(self) -> None:
        # A method, not `self._pressure = None` inline: a type checker then narrows the
        # attribute to None for the rest of `_actor_loop`, although `_route` may set it, and
        # mypyc (compiled.py) compiles that narrowing into a run-time type check.
        self._pressure = None

    async def _yield_to(self, target: Cell | None) -> None:
        await anyio.lowlevel.checkpoint()
        high_water = self._high_water
        for _ in range(self.max_backpressure_yields):
            if target is None or target.stats.mailbox_depth <= high_water or not target.alive:
                return
            await anyio.lowlevel.checkpoint()

    def _fail_in_task(self, exc: Exception) -> None:
        if self._tg is not None:
            self._tg.start_soon(_reraise, exc, name="deepserve kernel failure")

    def _drain_dead(self, cell: Cell) -> None:
        while (env := cell.mailbox.get_nowait()) is not None:
            cell.stats.mailbox_depth -= 1
            self._bounce(env, self.clock(), DEAD)

    # ---- routing hooks (the core is `DriverBase._route`) -------------------------
    def _enqueue(self, env: Envelope, t: float) -> bool:
        dst = env.dst
        cell = self.cells.get(dst)
        if cell is not None and cell.alive:
            mailbox = mailbox_of(cell)
            if self._stepping and not cell.inline and self.inline_local and mailbox.parked():
                cell.inline = 1  # run after the step, in this task (`_drain_inline`)
                self._inline_q.append((cell, env))
                return True
            # A second message in the same step goes to the mailbox and wakes the actor's
            # task: a burst is the actor's own to handle, in its loop (the queued first one
            # is put in front of it, `_drain_inline`).
            queue = mailbox._q
            room = len(queue) + cell.inline < mailbox.capacity  # a queued inline message counts
            if room and mailbox._waiter is None:
                queue.append(env)  # put_nowait, inlined: nobody to wake
                mailbox.puts += 1
            elif not room or not mailbox.put_nowait(env):
                cell.stats.mailbox_full += 1
                self._bounce(env, t, FULL)
                return False
            stats = cell.stats
            depth = stats.mailbox_depth = stats.mailbox_depth + 1
            if depth > self._high_water:  # the sender yields to it (`_yield_to`)
                self._pressure = cell
            return True
        transport = self.transport
        if cell is None and transport is not None and transport.owns(dst):
            if transport.send(env):
                if self._flow is not None:
                    # (not `room`: that name is a bool above, and compiled code checks it)
                    congestion = self._flow.congestion()
                    if congestion is not None:
                        self._remote_pressure = congestion
                return True
            # The peer is gone or far behind: a dead letter like any other.
            self._bounce(env, t, DEAD, TRANSPORT_REFUSED)
            return False
        self._bounce(env, t, DEAD)
        return False

    def _notice(self, env: Envelope, t: float) -> None:
        cell = self.cells.get(env.dst)
        if cell is not None and cell.alive:  # past the capacity: one notice per message sent
            cell.mailbox.put_notice(env)
            cell.stats.mailbox_depth += 1
        else:
            self._enqueue(env, t)

    def _spawn_child(self, env: Envelope, t: float) -> None:
        self._start_cell(env, t)

    def _report_failure(self, cell: Cell) -> None:
        """The log has the failure already; an operator watching a daemon sees it too."""
        self._note_stop(cell)
        for event in cell.ctx.events:
            if isinstance(event, HandlerFailed):
                log.warning("handler failed", actor=cell.addr, seq=cell.seq, error=event.error)
            elif isinstance(event, Stopped):
                log.warning("actor stopped", actor=cell.addr, seq=cell.seq, reason=event.reason)


async def _reraise(exc: Exception) -> None:
    """A failure outside any actor's task (a timer delivered in the loop callback whose step the
    sink refused), raised in a task of the driver's group: it fails the driver, as it would have
    in the actor's own task."""
    raise exc


def run(main: Any, *args: Any) -> Any:
    """Run an async entry point on anyio's asyncio backend, with uvloop when present
    (its loop roughly halves the per-message scheduling cost; see docs/decisions.md)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return anyio.run(main, *args)
    return anyio.run(main, *args, backend_options={"use_uvloop": True})


__all__ = ["TIMER_HEAP_SLACK", "AskError", "AsyncDriver", "run"]
