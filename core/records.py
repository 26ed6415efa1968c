"""Log records: what the kernel hands to an event store, one `Step` per delivery.

A step is the unit of atomicity: the input, the events it caused and the outputs
it produced are appended (and, in `outbox` mode, committed) together.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

# InputRec.kind
DELIVERED = 0  # handed to the actor's handler
DEAD = 1  # undeliverable: no such actor, or it had stopped
FULL = 2  # dropped: the target's mailbox was full
SNAPSHOT = 3  # not a delivery: the actor's live state at run end or at its stop

# OutputRec.kind
SEND = 0
TIMER = 1
CANCEL = 2
SPAWN = 3
STOP = 4

INPUT_KIND_NAMES = {DELIVERED: "deliver", DEAD: "dead", FULL: "full", SNAPSHOT: "snapshot"}
OUTPUT_KIND_NAMES = {SEND: "send", TIMER: "timer", CANCEL: "cancel", SPAWN: "spawn", STOP: "stop"}


class InputRec(msgspec.Struct, array_like=True, gc=False):
    actor: str
    seq: int  # the actor's delivery counter; -1 for dead letters and drops
    t: float  # clock time handed to the handler (virtual in sim, wall in daemon)
    hlc: int
    kind: int
    src: str
    msg_id: int
    corr: str | None
    reply_to: int | None
    external: bool
    type: str
    payload: bytes
    # Envelope facts a handler can read (`ctx.env.ask`, `ctx.env.hlc`): logged so that
    # replay hands it the very same envelope. Last, with defaults: schema v3 added them.
    ask: bool = False
    src_hlc: int = 0  # the sender's clock; `hlc` above is the receiver's after merging


class EventRec(msgspec.Struct, array_like=True, gc=False):
    actor: str
    seq: int
    idx: int
    type: str
    payload: bytes


class OutputRec(msgspec.Struct, array_like=True, gc=False):
    actor: str
    seq: int
    idx: int
    kind: int
    dst: str
    msg_id: int
    delay: float
    key: str | None  # timer key (timers and cancels)
    corr: str | None
    reply_to: int | None
    ask: bool
    type: str  # "" when the output carries no message (cancel, stop)
    payload: bytes


class SnapshotRec(msgspec.Struct, array_like=True, gc=False):
    actor: str
    seq: int  # state after this delivery
    type: str  # "module:QualName" of the state class
    payload: bytes


class Step(msgspec.Struct, array_like=True, gc=False):
    input: InputRec
    events: list[EventRec]
    outputs: list[OutputRec]
    snapshot: SnapshotRec | None = None


class RunRec(msgspec.Struct, array_like=True):
    run_id: str
    mode: str  # "sim" | "daemon"
    seed: int
    config: str  # full resolved config, JSON
    code_version: str
    host: str
    started_at: float  # wall clock, excluded from digests
    process: str = "main"


class LogSink(Protocol):
    """Where a driver appends its steps. Implemented by persistence writers."""

    def begin_run(self, run: RunRec) -> None: ...

    def append(self, step: Step) -> int:
        """Queue a step; returns a ticket for `outbox` release ordering."""
        ...

    def flush(self) -> None:
        """Block until everything appended so far is durable."""
        ...

    def close(self) -> None: ...


class MemorySink:
    """Keeps steps in a list: for tests, embedders and replay of in-memory runs."""

    def __init__(self) -> None:
        self.runs: list[RunRec] = []
        self.steps: list[Step] = []

    def begin_run(self, run: RunRec) -> None:
        self.runs.append(run)

    def append(self, step: Step) -> int:
        self.steps.append(step)
        return len(self.steps)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None
