"""A live actor's kernel bookkeeping, and the one function that executes a delivery.

`execute` is shared by `SimDriver`, `AsyncDriver` and replay: the exact same code
turns (actor, envelope, time) into (events, outputs), which is what makes a log
re-executable. It runs once a delivery, so its helpers (`address.hlc_merge`, `_begin`) are
inlined and its module names are `Final` C statics in the compiled build. `execute_reference`,
beside it, is the same delivery written with those helpers; read it first. It is never called
by a driver: tests/core/test_execute_reference.py runs both on twin cells over random deliveries
(a start, handler failures and restarts, asks answered and failed, stops) and checks the same
cell, context and results. Change both.
"""

from __future__ import annotations

import copy
import traceback
from time import perf_counter
from typing import Any, Final

import msgspec

from .actor import Actor, Directive
from .address import HLC_LOGICAL_BITS, hlc_merge
from .classpath import load_class
from .codec import encode
from .context import Context
from .envelope import Envelope
from .messages import (
    AskFailed,
    ChildFailed,
    Event,
    HandlerFailed,
    Restarted,
    Started,
    Stop,
    Stopped,
)

# The per-delivery path's module-level names again, as `Final`: the compiled build
# (compiled.py) keeps those in C statics, where a plain module global costs a dict lookup
# at every use (execute uses several a delivery).
_perf_counter: Final = perf_counter
_Started: Final = Started
_Stop: Final = Stop
_AskFailed: Final = AskFailed
_encode: Final = encode

_SYSTEM: Final[dict[type, bool]] = {}  # `Event.system` by event type (`_is_system`)

STAT_FIELDS = ("handled", "failed", "handler_time_s", "mailbox_depth", "mailbox_full", "dead")


class ActorStats:
    """Per-actor counters, readable while the driver runs."""

    __slots__ = STAT_FIELDS

    def __init__(self) -> None:
        self.handled = 0
        self.failed = 0
        self.handler_time_s = 0.0
        self.mailbox_depth = 0
        self.mailbox_full = 0
        self.dead = 0

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in STAT_FIELDS}


class Cell:
    """Kernel-side state of one actor incarnation."""

    __slots__ = (
        "addr", "actor", "seq", "hlc", "out_seq", "parent", "alive", "ctx", "stats",
        "snap", "events_since_snap", "event_bytes_since_snap", "final_seq", "restart_times",
        "mailbox", "task", "open_asks", "failed_asks", "inline", "log_addr",
    )

    def __init__(self, addr: str, seed: int, seq: int = 0) -> None:
        self.addr = addr
        self.actor: Actor[Any] | None = None
        self.seq = seq
        self.hlc = 0
        self.out_seq = 0
        self.parent: str | None = None
        self.alive = True
        self.ctx = Context(self, seed)
        self.stats = ActorStats()
        self.snap: tuple[Any, type, bytes] | None = None  # (state copy, type, encoding)
        self.events_since_snap: list[Event] = []
        self.event_bytes_since_snap = 0
        self.final_seq = -1  # seq of the last final snapshot logged (run end / stop)
        self.restart_times: list[float] = []
        self.mailbox: Any = None  # driver-specific
        self.task: Any = None
        self.inline = 0  # AsyncDriver: deliveries waiting in its inline queue for this cell
        self.log_addr: bytes | None = None  # `addr` as msgpack, once a page has a step of it
        # Asks routed and not yet settled, and (bounded, oldest first out) asks that
        # failed: an answer to either after it is settled is late (see `settle_ask`).
        self.open_asks: set[int] = set()
        self.failed_asks: dict[int, None] = {}


FAILED_ASKS_KEPT = 4096


def settle_ask(cell: Cell, env: Envelope) -> bool:
    """Settle the ask `env` answers; False if it is late (the ask was settled
    already: a reply after its failure, or a failure after its reply), which the
    driver records and does not deliver. Other messages pass (True)."""
    rid = env.reply_to
    if rid is None:
        return True
    opened = rid in cell.open_asks
    if type(env.msg) is _AskFailed:
        if not opened:
            return False
        cell.open_asks.discard(rid)
        failed = cell.failed_asks
        failed[rid] = None
        if len(failed) > FAILED_ASKS_KEPT:
            del failed[next(iter(failed))]
        return True
    if opened:
        cell.open_asks.discard(rid)
        return True
    if rid in cell.failed_asks:
        del cell.failed_asks[rid]
        return False
    return True  # a reply to a tell, or a further reply to an answered ask


def build_actor(started: Started) -> Actor[Any]:
    cls = load_class(started.cls)
    return cls(**started.args)


def _start(cell: Cell, started: Started) -> None:
    actor = cell.actor = build_actor(started)
    actor.state = actor.initial_state()
    cell.parent = started.parent
    cell.out_seq = 0
    cell.snap = None
    _take_snapshot(cell)
    actor.on_start(cell.ctx)


def encode_state(cell: Cell, state: Any) -> bytes:
    try:
        return encode(state)
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(
            f"state of {type(cell.actor).__name__} at {cell.addr} is not msgpack-encodable: {exc}"
        ) from None


def _take_snapshot(cell: Cell) -> None:
    """Snapshot what the events say: the last snapshot folded with the events since
    (the live state, for an actor that changes state only through `record`). A
    state mutated in place is not baked into snapshots, so the final snapshot
    (the live state, see `final_snapshot`) shows it to verify."""
    if cell.snap is None or cell.actor.snapshot_from_live:  # type: ignore[union-attr]
        state = copy.deepcopy(cell.actor.state)  # type: ignore[union-attr]
    else:
        state = restore_state(cell)  # a fresh copy: never shared with the live state
    # Kept as an object for restarts: decoding the bytes would turn tuples into
    # lists (msgpack has one array type).
    cell.snap = (state, type(state), encode_state(cell, state))
    cell.events_since_snap = []
    cell.event_bytes_since_snap = 0


def restore_state(cell: Cell) -> Any:
    """State from the last snapshot plus the events committed since."""
    actor, snap = cell.actor, cell.snap
    if actor is None or snap is None:
        raise RuntimeError(f"{cell.addr}: no state to restore (the actor never started)")
    state = copy.deepcopy(snap[0])
    for event in cell.events_since_snap:
        state = actor.evolve(state, event)
    return state


def execute(cell: Cell, env: Envelope, now: float) -> bool:
    """Run one delivery. Leaves events/outputs in `cell.ctx`; returns True if a
    snapshot was taken (the driver logs it)."""
    ctx = cell.ctx
    cell.seq += 1
    # hlc_merge, inlined (the per-delivery path of every driver and of replay)
    pt = int(now * 1_000_000) << HLC_LOGICAL_BITS
    local, remote = cell.hlc, env.hlc
    m = local if local > remote else remote
    cell.hlc = pt if pt > m else m + 1
    # ctx._begin, inlined
    ctx.env = env
    ctx._now = now
    ctx.events = []
    ctx.event_blobs = []
    ctx.outputs = []
    ctx._rng = None
    ctx._ids = 0
    ctx.stopping = False
    msg = env.msg
    if env.reply_to is not None and not (type(msg) is _AskFailed and env.src == cell.addr):
        ctx.cancel(f"ask:{env.reply_to}")  # the answer arrived: drop its timeout
    stats = cell.stats
    t0 = _perf_counter()
    try:
        kind = type(msg)
        if kind is _Started:
            _start(cell, msg)
        elif kind is _Stop:
            ctx.stopping = True
        else:
            cell.actor.handle(ctx, msg)  # type: ignore[union-attr]
    except Exception as exc:  # noqa: BLE001 — any handler failure is supervised
        _fail(cell, exc, now)
        stats.failed += 1
    stats.handled += 1
    stats.handler_time_s += _perf_counter() - t0
    if ctx.stopping and cell.alive:
        reason = f"stopped by {env.src}" if type(msg) is _Stop else "stopped itself"
        ctx.events.append(Stopped(reason=reason))
        cell.alive = False
    if ctx.events and cell.snap is not None:
        return _note_events(cell, ctx.events)
    return False


def _begin(ctx: Context, env: Envelope, now: float) -> None:
    """A fresh context for one delivery (`execute` inlines it)."""
    ctx.env = env
    ctx._now = now
    ctx.events = []
    ctx.event_blobs = []
    ctx.outputs = []
    ctx._rng = None
    ctx._ids = 0
    ctx.stopping = False


def execute_reference(cell: Cell, env: Envelope, now: float) -> bool:
    """`execute`, readable (the module's docstring): the same delivery, helpers called."""
    ctx = cell.ctx
    cell.seq += 1
    cell.hlc = hlc_merge(cell.hlc, env.hlc, now)  # a receive: the HLC moves past the sender's
    _begin(ctx, env, now)
    msg = env.msg
    own_timeout = type(msg) is AskFailed and env.src == cell.addr
    if env.reply_to is not None and not own_timeout:
        ctx.cancel(f"ask:{env.reply_to}")  # the answer arrived: drop its timeout
    t0 = perf_counter()
    try:
        if type(msg) is Started:
            _start(cell, msg)
        elif type(msg) is Stop:
            ctx.stopping = True
        else:
            cell.actor.handle(ctx, msg)  # type: ignore[union-attr]
    except Exception as exc:  # noqa: BLE001 — any handler failure is supervised
        _fail(cell, exc, now)
        cell.stats.failed += 1
    cell.stats.handled += 1
    cell.stats.handler_time_s += perf_counter() - t0
    if ctx.stopping and cell.alive:
        reason = f"stopped by {env.src}" if type(msg) is Stop else "stopped itself"
        ctx.events.append(Stopped(reason=reason))
        cell.alive = False
    if ctx.events and cell.snap is not None:
        return _note_events(cell, ctx.events)  # keep them for restarts; maybe a snapshot
    return False


def _note_events(cell: Cell, events: list[Event]) -> bool:
    """Keep the committed events for restarts; take a snapshot when it pays.

    Cost-aware policy: a snapshot is taken once at least `snapshot_every` events
    *and* at least as many bytes of events as the last snapshot's size were
    recorded since it. Snapshots then never add more to the log than the events
    do (a large state is copied rarely), and a restart folds at most that many
    events. Event encodings are kept for the log record (encoded once)."""
    blobs = cell.ctx.event_blobs = [_encode(e) for e in events]
    since = cell.events_since_snap
    n_bytes = cell.event_bytes_since_snap
    i = 0  # (an index, not `zip(..., strict=True)`: compiled, that is a call of the builtin
    for e in events:  # by name with a keyword, and an iterator and a tuple an event)
        if not _is_system(e):
            since.append(e)
            n_bytes += len(blobs[i])
        i += 1
    cell.event_bytes_since_snap = n_bytes
    # (the bytes first: a native read, where `snapshot_every` is looked up by name)
    if (
        cell.alive and n_bytes >= len(cell.snap[2])  # type: ignore[index]
        and len(since) >= cell.actor.snapshot_every  # type: ignore[union-attr]
    ):
        _take_snapshot(cell)
        return True
    return False


def _is_system(event: Event) -> bool:
    """`event.system`, by its type: a class attribute of a Struct is found by name (~200
    instructions a read, measured), a type in a dict by its address."""
    cls = type(event)
    system = _SYSTEM.get(cls)
    if system is None:
        system = _SYSTEM[cls] = bool(event.system)
    return system


def _fail(cell: Cell, exc: Exception, now: float) -> None:
    ctx = cell.ctx
    error = f"{type(exc).__name__}: {exc}"
    ctx.events = [HandlerFailed(error=error, traceback=traceback.format_exc())]
    ctx.outputs = []
    ctx.stopping = False
    actor = cell.actor
    if actor is None or cell.snap is None:  # failed while being built: nothing to restart
        ctx.events.append(Stopped(reason=f"failed to start: {error}"))
        cell.alive = False
        return
    actor.state = restore_state(cell)
    policy = actor.supervision
    directive = policy.directive
    if directive is Directive.RESTART:
        recent = [t for t in cell.restart_times if now - t < policy.window_s]
        if len(recent) >= policy.max_restarts:
            directive = Directive.STOP
        else:
            cell.restart_times = [*recent, now]
            ctx.events.append(Restarted(restarts=len(cell.restart_times)))
            return
    ctx.events.append(Stopped(reason=f"{directive.value}: {error}"))
    cell.alive = False
    if directive is Directive.ESCALATE and cell.parent is not None:
        ctx.send(cell.parent, ChildFailed(child=cell.addr, error=error))
