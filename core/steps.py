"""A delivery's log records: what a driver appends after `execute`, and what replay rebuilds.

Built once per logged delivery. For a sink that stores encoded pages (`append_page`: the
process writer's) the driver writes each step's msgpack straight into a `StepPage` as it is
made (`core/pagewriter.py`: no record objects, the bytes msgspec makes of its `Step`);
`make_step` builds the same record as a `Step`, for every other sink.
"""

from __future__ import annotations

from typing import Any, Final

from librt.strings import BytesWriter

from deepserve import BUILD

from .cell import Cell, encode_state, restore_state
from .classpath import class_path
from .codec import encode
from .context import Out
from .envelope import Envelope
from .messages import Event
from .pagewriter import write_delivery, write_record
from .records import (
    DELIVERED,
    SNAPSHOT,
    EventRec,
    InputRec,
    OutputRec,
    SnapshotRec,
    Step,
)

# The compiled build writes a page's steps field by field (pagewriter.py: ~50 native writes a
# step). Interpreted, those are ~50 calls, slower than msgspec encoding the step's row (a logged
# ping-pong step: 60k against 39k instructions, measured), so the pure build encodes rows.
NATIVE: Final = BUILD == "compiled"
# As `Final`: the compiled build keeps these in C statics (a module global is a dict lookup).
_encode: Final = encode
_DELIVERED: Final = int(DELIVERED)  # a plain int: msgspec encodes an IntEnum slowly


def input_record(cell: Cell, env: Envelope, now: float, kind: int = _DELIVERED) -> InputRec:
    payload = env.payload
    if payload is None:
        payload = env.payload = _encode(env.msg)
    return InputRec(
        cell.addr, cell.seq, now, cell.hlc, kind, env.src, env.msg_id, env.corr,
        env.reply_to, env.external, type(env.msg).__name__, payload, env.ask, env.hlc,
    )


def event_rows(cell: Cell, events: list[Event]) -> tuple[tuple[Any, ...], ...]:
    addr, seq = cell.addr, cell.seq
    return tuple([
        (addr, seq, i, type(e).__name__, b) for i, (e, b) in enumerate(_event_blobs(cell, events))
    ])


def event_records(cell: Cell, events: list[Event]) -> tuple[EventRec, ...]:
    addr, seq = cell.addr, cell.seq
    return tuple([
        EventRec(addr, seq, i, type(e).__name__, b) for i, (e, b) in enumerate(_event_blobs(cell, events))
    ])


def _event_blobs(cell: Cell, events: list[Event]) -> zip[tuple[Event, bytes]]:
    blobs = cell.ctx.event_blobs  # encoded by `record`, for the live delivery's own events
    if events is not cell.ctx.events or len(blobs) != len(events):
        blobs = [_encode(e) for e in events]
    return zip(events, blobs, strict=True)


def output_records(cell: Cell, outputs: list[Out]) -> tuple[OutputRec, ...]:
    addr, seq = cell.addr, cell.seq
    if len(outputs) == 1:  # the common case, without a list to build and drop
        return (_output_record(addr, seq, 0, outputs[0]),)
    return tuple([_output_record(addr, seq, i, o) for i, o in enumerate(outputs)])


def snapshot_record(cell: Cell) -> SnapshotRec:
    if cell.snap is None:
        raise RuntimeError(f"{cell.addr}: no snapshot taken")
    _, state_type, blob = cell.snap
    return SnapshotRec(cell.addr, cell.seq, class_path(state_type), blob)


def final_snapshot(cell: Cell, now: float) -> Step | None:
    """A record of the actor's live state at run end or at its stop (input kind
    `SNAPSHOT`, seq -1: not a delivery). Replay compares it with the fold of the
    actor's events, so a change to `evolve` alone, or a state changed outside
    `record`, is caught however short the run."""
    actor = cell.actor
    if actor is None or cell.snap is None or cell.final_seq == cell.seq:
        return None
    cell.final_seq = cell.seq
    state = actor.state
    snap = SnapshotRec(cell.addr, cell.seq, class_path(type(state)), encode_state(cell, state))
    rec = InputRec(
        cell.addr, -1, now, cell.hlc, SNAPSHOT, cell.addr, 0, None, None, False, "", b"", False, 0
    )
    return Step(rec, (), (), snap)


def folded_snapshot(cell: Cell) -> SnapshotRec:
    """What the events say the state is now: replay's side of a final snapshot."""
    state = restore_state(cell)
    return SnapshotRec(cell.addr, cell.seq, class_path(type(state)), encode_state(cell, state))


def make_step(cell: Cell, env: Envelope, now: float, snapshot: bool) -> Step:
    """The log record of the delivery `execute` just made, as a `Step`: `make_row`'s
    fields as Structs, for sinks that take no rows (built directly: a row and its
    conversion would cost ~2.5k instructions, and `input_record` and `output_records`
    called from here ~700 more, measured)."""
    ctx = cell.ctx
    addr = cell.addr
    seq: Any = cell.seq  # boxed once (see make_row)
    msg = env.msg
    payload = env.payload
    if payload is None:
        payload = env.payload = _encode(msg)
    inp = InputRec(
        addr, seq, now, cell.hlc, _DELIVERED, env.src, env.msg_id, env.corr,
        env.reply_to, env.external, type(msg).__name__, payload, env.ask, env.hlc,
    )
    events = ctx.events
    outputs = ctx.outputs
    if not outputs:
        outs: tuple[OutputRec, ...] = ()
    elif len(outputs) == 1:
        outs = (_output_record(addr, seq, 0, outputs[0]),)
    else:
        outs = tuple([_output_record(addr, seq, i, o) for i, o in enumerate(outputs)])
    return Step(
        inp,
        event_records(cell, events) if events else (),
        outs,
        snapshot_record(cell) if snapshot else None,
    )


def make_row(cell: Cell, env: Envelope, now: float, snapshot: bool) -> tuple[Any, ...]:
    """The log record of the delivery `execute` just made, as a row.
    `input_record` and the output rows, inlined: this runs once per logged delivery."""
    ctx = cell.ctx
    addr = cell.addr
    # Boxed once, shared by the input and output rows (the compiled build keeps ints and
    # floats unboxed, and would box `seq` again for every row).
    seq: Any = cell.seq
    msg = env.msg
    payload = env.payload
    if payload is None:
        payload = env.payload = _encode(msg)
    inp = (
        addr, seq, now, cell.hlc, _DELIVERED, env.src, env.msg_id, env.corr,
        env.reply_to, env.external, type(msg).__name__, payload, env.ask, env.hlc,
    )
    events = ctx.events
    outputs = ctx.outputs
    if not outputs:
        outs: tuple[tuple[Any, ...], ...] = ()
    elif len(outputs) == 1:  # the common case, without a list to build and drop
        outs = (_output_row(addr, seq, 0, outputs[0]),)
    else:
        outs = tuple([_output_row(addr, seq, i, o) for i, o in enumerate(outputs)])
    # The snapshot (rare) stays a Struct: it encodes as its row would.
    return (inp, event_rows(cell, events) if events else (), outs,
            snapshot_record(cell) if snapshot else None)  # fmt: skip


def _output_row(addr: str, seq: Any, i: int, o: Out) -> tuple[Any, ...]:
    """Output `i` of a delivery as a row (`_output_record`'s fields, in order)."""
    name, blob = _output_message(o)
    return (addr, seq, i, o.kind, o.dst, o.msg_id, o.delay, o.key, o.corr, o.reply_to, o.ask, name, blob)


def _output_record(addr: str, seq: Any, i: int, o: Out) -> OutputRec:
    """Output `i` of a delivery, as logged and as replay rebuilds it."""
    name, blob = _output_message(o)
    return OutputRec(
        addr, seq, i, o.kind, o.dst, o.msg_id, o.delay, o.key, o.corr, o.reply_to, o.ask, name, blob
    )


def _output_message(o: Out) -> tuple[str, bytes]:
    """An output's message type and encoding; the encoding stays on `o` for the receiver's
    input record (`Out.payload`)."""
    m = o.msg
    if m is None:
        return "", b""
    blob = o.payload = _encode(m)
    return type(m).__name__, blob


class StepPage:
    """Steps encoded as they are made, back to back (the same bytes as msgspec's `Step`s),
    with their count and time bounds: a page's body for a sink that stores pages
    (`append_page`). Encoding a step while its objects are fresh keeps no record alive
    between deliveries."""

    def __init__(self) -> None:
        self.body = BytesWriter()
        self.steps = 0
        self.t_first = 0.0
        self.t_last = 0.0

    def add_delivery(self, cell: Cell, env: Envelope, t: float, snapshot: bool) -> int:
        """Append the step of the delivery `execute` just made (at time `t`; `snapshot`:
        whether it took one); returns the steps now held."""
        if NATIVE:
            write_delivery(self.body, cell, env, t, snapshot_record(cell) if snapshot else None)
        else:
            write_record(self.body, make_row(cell, env, t, snapshot))
        return self._count(t)

    def add(self, step: Step) -> int:
        """Append a `Step` (a dead letter, a final snapshot); returns the steps now held."""
        write_record(self.body, step)
        return self._count(step.input.t)

    def _count(self, t: float) -> int:
        if self.steps == 0:
            self.t_first = self.t_last = t
        elif t < self.t_first:
            self.t_first = t
        elif t > self.t_last:
            self.t_last = t
        self.steps += 1
        return self.steps

    def take(self) -> bytes:
        """The body so far, and start a new page."""
        body = self.body.getvalue()
        self.body.truncate(0)
        self.steps = 0
        return body
