"""What both drivers share: the actor registry, run record, dead letters, stats."""

from __future__ import annotations

import json
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .actor import class_path
from .address import EXTERNAL_PREFIX, check_address, hlc_physical
from .cell import Cell, final_snapshot, input_record
from .envelope import Envelope
from .messages import AskFailed, Message, Started, Stopped
from .records import DEAD, FULL, LogSink, RunRec, Step

CODE_VERSION = "0.1.0"


class DriverBase:
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
        assert mailbox_capacity > 0
        self.seed = seed
        self.sink = sink
        self.mailbox_capacity = mailbox_capacity
        self.cells: dict[str, Cell] = {}
        self._retired_seq: dict[str, int] = {}  # a re-spawned address continues its numbering
        self._ext_seq = 0
        self.dead_letters = 0
        self.mailbox_full = 0
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
        if self.cells.get(cell.addr) is cell:
            del self.cells[cell.addr]
            self._retired_seq[cell.addr] = cell.seq
        self._log_final(cell, t)

    def _log_final(self, cell: Cell, t: float) -> None:
        if self.sink is not None:
            step = final_snapshot(cell, t)
            if step is not None:
                self.sink.append(step)

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
        self, addr: str, entries: list[tuple[float, int, Envelope, str | None]],
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
        self.external_out.append((t, env))
        if self.on_external is not None:
            self.on_external(t, env)

    def _note_stop(self, cell: Cell) -> None:
        """A root actor that escalates has no parent to tell: the driver keeps it."""
        if cell.parent is not None:
            return
        for event in cell.ctx.events:
            if isinstance(event, Stopped) and event.reason.startswith("escalate"):
                self.escalations.append((cell.addr, event.reason))

    # ---- undeliverable ---------------------------------------------------
    def _undeliverable(
        self, env: Envelope, t: float, kind: int, reason: str | None = None
    ) -> Envelope | None:
        """Record a dead letter or a drop; return the `AskFailed` owed to an asker."""
        if kind == DEAD:
            self.dead_letters += 1
        else:
            self.mailbox_full += 1
        if self.sink is not None:
            ghost = Cell(env.dst, self.seed, -1)  # seq -1 marks "not delivered"
            ghost.hlc = env.hlc  # so merged logs still order it by time
            self.sink.append(Step(input_record(ghost, env, t, kind), [], []))
        if not env.ask:
            return None
        if reason is None:
            reason = "target is dead" if kind == DEAD else "target mailbox is full"
        fail = AskFailed(request_id=env.msg_id, target=env.dst, reason=reason)
        return Envelope(env.dst, env.src, 0, env.hlc, env.corr, fail, env.msg_id)


__all__ = ["DriverBase", "DEAD", "FULL"]
