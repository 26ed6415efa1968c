"""Log records: what the kernel hands to an event store, one `Step` per delivery.

A step is the unit of atomicity: the input, the events it caused and the outputs
it produced are appended (and, in `outbox` mode, committed) together.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Protocol

import msgspec


class InputKind(IntEnum):
    """`InputRec.kind`: what became of an input."""

    DELIVERED = 0  # handed to the actor's handler
    DEAD = 1  # undeliverable: no such actor, it had stopped, or the transport refused
    FULL = 2  # dropped: the target's mailbox was full
    SNAPSHOT = 3  # not a delivery: the actor's live state at run end or at its stop
    LATE = 4  # not delivered: an answer to an ask already settled (failed, or answered)


class OutputKind(IntEnum):
    """`OutputRec.kind` (and the context's pending outputs): what a handler asked for."""

    SEND = 0
    TIMER = 1
    CANCEL = 2
    SPAWN = 3
    STOP = 4


DELIVERED, DEAD, FULL, SNAPSHOT, LATE = InputKind
SEND, TIMER, CANCEL, SPAWN, STOP = OutputKind

INPUT_KIND_NAMES: dict[int, str] = {
    DELIVERED: "deliver", DEAD: "dead", FULL: "full", SNAPSHOT: "snapshot", LATE: "late",
}
OUTPUT_KIND_NAMES: dict[int, str] = {k: k.name.lower() for k in OutputKind}


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
    # Tuples, not lists: a step waits in the sink's buffer until its batch is written, and
    # lists there are containers the cyclic GC re-scans each collection (~20 % of a logged
    # delivery's CPU, measured); a tuple of untracked records is untracked after one.
    input: InputRec
    events: tuple[EventRec, ...]
    outputs: tuple[OutputRec, ...]
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

    # Optional, for a sink that stores pages of encoded steps (`SimDriver` uses it):
    # `page_steps` (the most steps a page holds) and `append_page(body, steps, t_first,
    # t_last) -> int`: `steps` steps, each encoded as msgpack (a `Step`, or its row: the same
    # bytes, core/steps.py) back to back in `body`, their input times within [t_first,
    # t_last]; the same as `append` on each step in order (returns the last ticket). It must
    # copy `body` before it returns.
    #
    # Optional, for designed backpressure (persistence's `PressureSink`):
    # `under_pressure` (True while the writer is behind) and `await wait_for_room()`.
    # `AsyncDriver` then admits no external input (`inject` waits, `inject_nowait`
    # refuses), so `append` — which blocks the event loop when the queue is full —
    # is reached only by work already admitted.


class DurableSink(LogSink, Protocol):
    """A `LogSink` that reports commits: what `AsyncDriver(outbox=True)` needs to
    release a delivery's outputs only after its records are durable.

    `on_commit`, set by the driver, is called with the highest committed ticket after
    each commit (from the writer thread; synchronously inside `append` for
    `MemoryStore`). Register a hold for ticket t first, then check
    `committed_ticket >= t`: the commit may have landed in between."""

    on_commit: Callable[[int], None] | None

    @property
    def committed_ticket(self) -> int: ...


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
