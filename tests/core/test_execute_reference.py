"""`cell.execute` (the per-delivery fast path, its helpers inlined) does what its readable
version beside it in the source, `cell.execute_reference`, does: twin cells fed the same random
deliveries (a start, records, sends, asks answered and timed out, timers, handler failures with
restarts, stops) end each delivery with the same cell, context and result."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_actors import (
    Add,
    AskIt,
    Boom,
    CancelTimer,
    Child,
    Counter,
    Forward,
    Fragile,
    Noted,
    SetTimer,
    SpawnChild,
    StopOnFailure,
    StopSelf,
)

from deepserve.core.cell import Cell, execute, execute_reference
from deepserve.core.classpath import class_path
from deepserve.core.context import Context
from deepserve.core.envelope import Envelope
from deepserve.core.messages import AskFailed, HandlerFailed, Message, Started, Stop

ADDR = "c/0"


class Snappy(Counter):
    """Snapshots often, and draws from its delivery's random stream and ids."""

    snapshot_every = 2

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Add) and msg.n % 3 == 0:
            ctx.record(Noted(f"{ctx.rng.random()}:{ctx.new_id()}"))
        super().handle(ctx, msg)


CLASSES = (Counter, Fragile, StopOnFailure, Child, Snappy)

messages = st.one_of(
    st.builds(Add, st.integers(-5, 9)),
    st.builds(Boom, st.booleans()),
    st.builds(Forward, st.just("c/1"), st.integers(0, 3)),
    st.builds(AskIt, st.just("c/1"), st.sampled_from([0.5, 1.0])),
    st.builds(AskFailed, request_id=st.integers(1, 6), target=st.just("c/1"), reason=st.just("timeout")),
    st.builds(SetTimer, st.sampled_from(["a", "b"]), st.sampled_from([0.0, 0.25]), st.integers(0, 3)),
    st.builds(CancelTimer, st.sampled_from(["a", "b"])),
    st.builds(SpawnChild, st.just("c/0/k")),
    st.just(StopSelf()),
    st.just(Stop(by="p/0")),
)
deliveries = st.lists(
    st.tuples(messages, st.sampled_from([ADDR, "c/1", "ext/op"]), st.one_of(st.none(), st.integers(1, 6)),
              st.integers(0, 2**52), st.floats(0.0, 5.0, allow_nan=False)),
    max_size=25,
)  # fmt: skip


def _view(cell: Cell, result: bool) -> tuple[Any, ...]:
    """Everything a delivery leaves, but its handler's timing and a failure's traceback (whose
    frames name the function that ran the handler)."""
    ctx = cell.ctx
    events = [(HandlerFailed, e.error) if type(e) is HandlerFailed else e for e in ctx.events]
    blobs = [b for e, b in zip(ctx.events, ctx.event_blobs, strict=False) if type(e) is not HandlerFailed]
    outputs = [(o.kind, o.dst, o.msg, o.delay, o.msg_id, o.corr, o.reply_to, o.ask, o.key) for o in ctx.outputs]
    snap = cell.snap[2] if cell.snap is not None else None
    state = cell.actor.state if cell.actor is not None else None
    return (result, cell.seq, cell.hlc, cell.out_seq, cell.alive, cell.parent, cell.stats.handled,
            cell.stats.failed, cell.restart_times, snap, cell.events_since_snap,
            cell.event_bytes_since_snap, events, blobs, outputs, ctx.stopping, ctx._ids, ctx._now,
            ctx.env, state)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(cls=st.sampled_from(CLASSES), steps=deliveries, seed=st.integers(0, 2**32))
def test_execute_and_its_readable_reference_agree(cls: type, steps: list, seed: int) -> None:
    fast, slow = Cell(ADDR, seed), Cell(ADDR, seed)
    start = Envelope("ext/op", ADDR, 1, 0, None, Started(cls=class_path(cls), args={}, parent="p/0"))
    now = 0.0
    for i, (msg, src, reply_to, hlc, dt) in enumerate([(start.msg, "ext/op", None, 0, 0.0), *steps]):
        now += dt
        env = Envelope(src, ADDR, i + 1, hlc, f"r{i % 3}", msg, reply_to, False, False)
        a, b = execute(fast, env, now), execute_reference(slow, env, now)
        assert _view(fast, a) == _view(slow, b), (i, msg)
        if not fast.alive:
            break


def test_the_view_tells_a_difference() -> None:
    """The comparison is not vacuous: one delivery more on one side differs."""
    fast, slow = Cell(ADDR, 1), Cell(ADDR, 1)
    start = Envelope("ext/op", ADDR, 1, 0, None, Started(cls=class_path(Snappy), args={}))
    assert _view(fast, execute(fast, start, 0.0)) == _view(slow, execute_reference(slow, start, 0.0))
    env = Envelope("c/1", ADDR, 2, 7, None, Add(3))
    execute(fast, env, 1.0)
    assert _view(fast, False) != _view(slow, False)
