"""What both drivers share: the actor registry, run record, the routing core
(`_route`, `_send`, `_bounce`, `_retire`), dead letters, asks from outside, stats.

The routing core is written once; a driver supplies five small hooks that say how
its time and queues work: `_enqueue` (a message to an actor address: queue it or
bounce it), `_notice` (a kernel notice to a sender, past its capacity),
`_set_timer`, `_spawn_child` and `_timer_entries`."""

from __future__ import annotations

import abc
import json
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

from .address import EXTERNAL_PREFIX, HLC_LOGICAL_BITS, check_address, hlc_physical
from .cell import Cell
from .classpath import class_path
from .codeid import CODE_VERSION  # the release and a hash of the sources
from .context import Out
from .envelope import Envelope
from .messages import AskFailed, Message, Started, Stop, Stopped, Undelivered
from .records import (
    CANCEL,
    DEAD,
    FULL,
    LATE,
    SEND,
    SPAWN,
    TIMER,
    LogSink,
    RunRec,
    Step,
)
from .steps import final_snapshot, input_record

TRANSPORT_REFUSED = "transport refused"
ASK_SRC = "ext/ask"  # the source address of asks from outside the actor system
# Module-level names of the per-message path again, as `Final`: C statics in the compiled
# build (compiled.py), where a plain module global costs a dict lookup at every use.
_SEND: Final = int(SEND)  # `Out.kind` is a plain int (context.py)
_TIMER: Final = int(TIMER)
_CANCEL: Final = int(CANCEL)
_SPAWN: Final = int(SPAWN)


class AskError(Exception):
    """An external `ask` (`SimDriver.ask`, `AsyncDriver.ask`) failed. Carries what
    an actor's `AskFailed` carries: the request id, the target and the reason
    ("target is dead", "target mailbox is full", "transport refused",
    "timeout after Ns")."""

    def __init__(self, request_id: int, target: str, reason: str) -> None:
        super().__init__(f"ask #{request_id} to {target} failed: {reason}")
        self.request_id = request_id
        self.target = target
        self.reason = reason


class DriverBase(abc.ABC):
    """Registry of cells and the bookkeeping that does not depend on how time flows."""

    mode = "sim"

    def __init__(
        self,
        seed: int = 0,
        sink: LogSink | None = None,
        mailbox_capacity: int = 65_536,
        run_id: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        if mailbox_capacity <= 0:
            raise ValueError(f"mailbox_capacity must be positive, got {mailbox_capacity}")
        self.seed = seed
        self.sink = sink
        self.mailbox_capacity = mailbox_capacity
        self.cells: dict[str, Cell] = {}
        self._retired_seq: dict[str, int] = {}  # a re-spawned address continues its numbering
        self._ext_seq = 0
        self.dead_letters = 0
        self.mailbox_full = 0
        self.late_replies = 0  # answers to asks already settled: recorded, not delivered
        self._waiters: dict[int, list[Any]] = {}  # external ask id -> [signal, reply]
        self._timers: dict[tuple[str, str], int] = {}  # (addr, key) -> live timer's seq
        self.escalations: list[tuple[str, str]] = []
        # What actors sent to the outside world, newest last; bounded (a daemon runs
        # for days): a frontend takes its messages through `on_external` instead.
        self.external_out: deque[tuple[float, Envelope]] = deque(maxlen=100_000)
        self.on_external: Callable[[float, Envelope], None] | None = None
        self.run_id = run_id or f"{self.mode}-{seed}"
        if sink is not None:
            sink.begin_run(
                RunRec(
                    run_id=self.run_id, mode=self.mode, seed=seed,
                    config=json.dumps(config or {}, sort_keys=True), code_version=CODE_VERSION,
                    host=socket.gethostname(), started_at=time.time(),
                )
            )

    # ---- registry -------------------------------------------------------
    def _new_cell(self, addr: str) -> Cell:
        cell = Cell(addr, self.seed, self._retired_seq.pop(addr, 0))
        self.cells[addr] = cell
        return cell

    def _retire(self, cell: Cell, t: float) -> None:
        """A stopped actor leaves the registry; its final state is logged and its
        pending timers become dead letters (never delivered to a later incarnation)."""
        if self.cells.get(cell.addr) is cell:
            del self.cells[cell.addr]
            self._retired_seq[cell.addr] = cell.seq
        self._log_final(cell, t)
        for env in self._pending_timers(cell.addr, self._timer_entries(), self._timers):
            self._bounce(env, t, DEAD)

    def _log(self, step: Step) -> None:
        """Hand a record to the sink (`SimDriver` batches them)."""
        self.sink.append(step)  # type: ignore[union-attr]

    def _log_final(self, cell: Cell, t: float) -> None:
        if self.sink is not None:
            step = final_snapshot(cell, t)
            if step is not None:
                self._log(step)

    def _snapshot_live(self, t: float) -> None:
        """Log the live state of every actor that changed since its last final
        snapshot, so replay compares every actor's final state (run end, stop)."""
        if self.sink is not None:
            for cell in list(self.cells.values()):
                if cell.alive:
                    self._log_final(cell, t)

    def alive(self, addr: str) -> bool:
        cell = self.cells.get(addr)
        return cell is not None and cell.alive

    def actor(self, addr: str) -> Any:
        """The live actor object at `addr` (read its `.state`)."""
        cell = self.cells.get(addr)
        if cell is None or cell.actor is None:
            raise KeyError(f"no live actor at {addr!r}")
        return cell.actor

    def stats(self) -> dict[str, dict[str, Any]]:
        return {addr: cell.stats.as_dict() for addr, cell in self.cells.items()}

    # ---- external inputs -------------------------------------------------
    def _external_env(
        self, dst: str, msg: Message, corr: str | None, src: str, t: float, ask: bool = False
    ) -> Envelope:
        """An envelope for an input from outside, delivered at clock time `t`."""
        check_address(dst)
        if not src.startswith(EXTERNAL_PREFIX):
            raise ValueError(f"external source must start with {EXTERNAL_PREFIX!r}: {src!r}")
        self._ext_seq += 1
        # The outside world has no clock of ours: stamp the input with the driver's time.
        return Envelope(src, dst, self._ext_seq, hlc_physical(t), corr, msg, None, ask, True)

    def _spawn_env(
        self, addr: str, cls: type, kwargs: dict[str, Any], src: str, t: float
    ) -> Envelope:
        started = Started(cls=class_path(cls), args=kwargs, parent=None)
        return self._external_env(addr, started, None, src, t)

    def _pending_timers(
        self, addr: str, entries: Sequence[tuple[float, int, Envelope, str | None]],
        timers: dict[tuple[str, str], int],
    ) -> list[Envelope]:  # fmt: skip
        """Take `addr`'s live timers out of `timers`, in the order they were set.
        Both drivers turn them into dead letters when the actor stops: recorded, and
        never delivered to a later incarnation at the same address."""
        live = sorted(
            (seq, env) for _, seq, env, key in entries
            if key is not None and env.dst == addr and timers.get((addr, key)) == seq
        )  # fmt: skip
        for tkey in [k for k in timers if k[0] == addr]:
            del timers[tkey]
        return [env for _, env in live]

    def _to_outside(self, t: float, env: Envelope) -> None:
        if env.reply_to is not None and env.dst == ASK_SRC:
            slot = self._waiters.get(env.reply_to)
            if slot is None:  # the external ask failed (timed out) already
                self._undeliverable(env, t, LATE)
            else:
                self._answer(slot, env.msg)
            return
        self.external_out.append((t, env))
        if self.on_external is not None:
            self.on_external(t, env)

    def _answer(self, slot: list[Any], msg: Any) -> None:
        """Hand an external ask its answer (driver-specific wake-up)."""
        slot[1] = msg

    @staticmethod
    def _ask_result(request_id: int, target: str, reply: Any) -> Any:
        if isinstance(reply, AskFailed):
            raise AskError(request_id, target, reply.reason)
        return reply

    def _note_stop(self, cell: Cell) -> None:
        """A root actor that escalates has no parent to tell: the driver keeps it."""
        if cell.parent is not None:
            return
        for event in cell.ctx.events:
            if isinstance(event, Stopped) and event.reason.startswith("escalate"):
                self.escalations.append((cell.addr, event.reason))

    # ---- routing: one core, per-driver hooks --------------------------------
    def _route(self, cell: Cell, outputs: list[Out], t: float) -> None:
        """Carry out a delivery's outputs. A logged one's outputs carry their encodings
        (`Out.payload`), which the receivers' input records reuse."""
        addr = cell.addr
        hlc = cell.hlc
        # Every output is a send event at t: `hlc_tick`, unrolled (`hlc_physical` inlined).
        pt = int(t * 1_000_000) << HLC_LOGICAL_BITS
        for o in outputs:
            hlc = pt if pt > hlc else hlc + 1
            kind = o.kind
            if kind == _SEND:  # the hot path: `_send` inlined
                if o.ask:
                    cell.open_asks.add(o.msg_id)
                env = Envelope(addr, o.dst, o.msg_id, hlc, o.corr, o.msg, o.reply_to, o.ask, False, o.payload)
                if o.dst.startswith(EXTERNAL_PREFIX):
                    self._to_outside(t, env)
                else:
                    self._enqueue(env, t)
            elif kind == _TIMER:  # (with its encoding, as a send: the input record reuses it)
                env = Envelope(addr, addr, o.msg_id, hlc, o.corr, o.msg, o.reply_to, False, False, o.payload)
                self._set_timer(t + o.delay, env, o.key)  # type: ignore[arg-type]
            elif kind == _CANCEL:
                self._timers.pop((addr, o.key), None)  # type: ignore[arg-type]
            elif kind == _SPAWN:
                self._spawn_child(Envelope(addr, o.dst, o.msg_id, hlc, o.corr, o.msg), t)
            else:  # STOP another actor
                self._send(Envelope(addr, o.dst, o.msg_id, hlc, o.corr, Stop(by=addr)), t)
        cell.hlc = hlc

    def _send(self, env: Envelope, t: float) -> bool:
        """Route one envelope: to the outside world, or into the driver's queues."""
        if env.dst.startswith(EXTERNAL_PREFIX):
            self._to_outside(t, env)
            return True
        return self._enqueue(env, t)

    def _bounce(self, env: Envelope, t: float, kind: int, reason: str | None = None) -> None:
        """Record an undeliverable envelope and tell its sender what it is owed."""
        told = self._undeliverable(env, t, kind, reason)
        if told is None:
            return
        if told.dst.startswith(EXTERNAL_PREFIX):
            self._to_outside(t, told)
        else:
            self._notice(told, t)

    # Hooks (each driver's): how its queues and timers work.
    @abc.abstractmethod
    def _enqueue(self, env: Envelope, t: float) -> bool:
        ...

    @abc.abstractmethod
    def _notice(self, env: Envelope, t: float) -> None:
        ...

    @abc.abstractmethod
    def _set_timer(self, deadline: float, env: Envelope, key: str) -> None:
        ...

    @abc.abstractmethod
    def _spawn_child(self, env: Envelope, t: float) -> None:
        ...

    @abc.abstractmethod
    def _timer_entries(self) -> Sequence[tuple[float, int, Envelope, str | None]]:
        ...

    # ---- undeliverable ---------------------------------------------------
    def _undeliverable(
        self, env: Envelope, t: float, kind: int, reason: str | None = None
    ) -> Envelope | None:
        """Record a dead letter, a drop or a late answer; return what the sender is
        owed: `AskFailed` for an ask, `Undelivered` for a tell between actors that
        was not delivered (target stopped or absent, mailbox full, transport
        refused). Not told: the outside world (its inputs are logged), an actor about
        its own timers and self-sends (a stopped actor's timers are many, and it is
        gone too), and nobody about a kernel notice (msg_id 0): no notice loops."""
        if kind == DEAD:
            self.dead_letters += 1
        elif kind == FULL:
            self.mailbox_full += 1
        else:
            self.late_replies += 1
        if self.sink is not None:
            ghost = Cell(env.dst, self.seed, -1)  # seq -1 marks "not delivered"
            ghost.hlc = env.hlc  # so merged logs still order it by time
            self._log(Step(input_record(ghost, env, t, kind), (), ()))
        if kind == LATE:
            return None
        if reason is None:
            reason = "target is dead" if kind == DEAD else "target mailbox is full"
        if env.ask:
            fail: Message = AskFailed(request_id=env.msg_id, target=env.dst, reason=reason)
            return Envelope(env.dst, env.src, 0, env.hlc, env.corr, fail, env.msg_id)
        if not env.external and env.msg_id != 0 and env.src != env.dst:
            told = Undelivered(env.msg_id, env.dst, reason, type(env.msg).__name__)
            return Envelope(env.dst, env.src, 0, env.hlc, env.corr, told)
        return None


__all__ = ["ASK_SRC", "AskError", "DriverBase", "DEAD", "FULL", "LATE"]
