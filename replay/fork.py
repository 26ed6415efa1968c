"""The driver's image at a clock time T, read off a simulation's log (issue 32: `whatif --from T`).

One pass over the log's steps up to T (the same pass that reads the run's inputs,
replay/inputs.py: it hands each page here) keeps, per address, what `core/restore.py` needs to
put the actor back: its incarnation's `Started`, its delivery counter, its clock (the input's
HLC stepped once per output, as the driver routes them), its output counter (the last output's
id), its last logged snapshot and the events since (left as bytes until the end: most are
superseded by a later snapshot), its open and failed asks (`settle_ask`'s rules), its restart
times. And every timer still armed: a timer output sets its (address, key), a cancel output or
the actor's stop clears it, a later one with the key replaces it; those due after T are the
pending ones, in the order they were armed.

What the log cannot say, and the restore refuses (`Cut.unsure`): an actor whose handler failed
after its last logged output (a failed delivery's outputs are dropped, not its output counter's
advance, so the counter is unknown).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import Any

import msgspec

from deepserve.core.address import HLC_LOGICAL_BITS
from deepserve.core.classpath import load_logged_class
from deepserve.core.codec import decode
from deepserve.core.envelope import Envelope
from deepserve.core.messages import Raw, Started
from deepserve.core.records import CANCEL, DEAD, LATE, SEND, SNAPSHOT, TIMER, EventRec, OutputRec
from deepserve.core.restore import CellImage

from .common import ReplayError
from .inputs import Prefix

METRICS_ADDR = "ext/metrics"
TERMINAL_TYPES = ("RequestDone", "Refused")  # what a run's collector counts (cluster/sim.py `listen`)
_EVENTS = msgspec.msgpack.Decoder(tuple[EventRec, ...])
_OUTPUTS = msgspec.msgpack.Decoder(tuple[OutputRec, ...])
_SYSTEM = re.compile(b"HandlerFailed|Restarted|Stopped").search
_SEND, _TIMER, _CANCEL, _SNAPSHOT, _LATE, _DEAD = int(SEND), int(TIMER), int(CANCEL), int(SNAPSHOT), int(LATE), int(DEAD)


class _Actor:
    __slots__ = ("image", "raw_events", "snap", "unsure")

    def __init__(self, image: CellImage) -> None:
        self.image = image
        self.raw_events: list[bytes] = []  # each step's events, as logged, since the last snapshot
        self.snap: tuple[str, bytes] | None = None  # (state type, encoding) of the last logged snapshot
        self.unsure = False  # a handler failed after the last logged output


def _state_type(addr: str, path: str) -> type:
    """A logged snapshot's state class: one the actor's own modules defined (loaded already, never
    imported for this: a log is data), a msgspec Struct or a builtin type."""
    import builtins
    import sys

    module_name, _, qualname = path.partition(":")
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and (issubclass(obj, msgspec.Struct) or getattr(builtins, obj.__name__, None) is obj):
        return obj  # type: ignore[return-value]
    raise ReplayError(f"--from: {addr}'s snapshot is of state type {path!r}, which its actor's modules do not define")


class Timer(msgspec.Struct, array_like=True):
    order: tuple[int, int]  # (step index, output index): the order the original armed it in
    deadline: float
    env: Any  # Envelope
    key: str


class Cut(Prefix):
    """`Prefix` (the hash of the steps up to T) that also keeps the driver's image at T."""

    def __init__(self, until_s: float) -> None:
        super().__init__(until_s)
        self.live: dict[str, _Actor] = {}  # in the order the driver's cells were made
        self.retired: dict[str, int] = {}  # a stopped address's delivery counter
        self.timers: dict[tuple[str, str], tuple[int, OutputRec, int, float]] = {}  # -> (step, output, HLC, time)
        self.times: list[float] = []  # every step's time up to T, in log order
        self.first_request_id: int | None = None  # the external id of the first ApiRequest
        self.request_step: dict[int, int] = {}  # a request's external id -> the step delivering it
        self.last_t = 0.0
        self.delivered = 0  # deliveries up to T
        self.delivered_by: list[int] = []  # deliveries made by each step (aligned with `times`)
        self.terminal_at: list[int] = []  # for each terminal record sent outside: the deliveries made with it

    def page(self, light: list[Any], body: bytes) -> None:
        # (no hash of the steps, as `Prefix` keeps: a restore checks nothing against them; the
        # re-run fallback reads its prefix's hash again)
        for st in light:
            if st.input.t > self.until_s:
                self.done = True
                return
            self._step(st)

    def _step(self, st: Any) -> None:
        inp = st.input
        i = len(self.times)
        self.times.append(inp.t)
        self.last_t = inp.t
        if inp.seq >= 0:
            self.delivered += 1
        self.delivered_by.append(self.delivered)
        addr = inp.actor
        a = self.live.get(addr)
        if inp.seq < 0:
            if inp.kind == _SNAPSHOT and a is not None:
                a.image.final_seq = a.image.seq
            elif inp.kind == _LATE and a is not None and inp.reply_to is not None and inp.type != "AskFailed":
                a.image.failed_asks.pop(inp.reply_to, None)  # settle_ask forgets it as it refuses it
            return
        if inp.type == "Started":  # a new incarnation (a Started to a live actor bounces: seq -1)
            started = decode("Started", inp.payload)
            assert isinstance(started, Started)
            self.live.pop(addr, None)
            a = self.live[addr] = _Actor(CellImage(addr, started))
            self.retired.pop(addr, None)
        elif a is None:
            raise ReplayError(f"--from: {addr}#{inp.seq}: first logged input is {inp.type}, not Started")
        if inp.type == "ApiRequest" and inp.src.startswith("ext/"):
            if self.first_request_id is None:
                self.first_request_id = inp.msg_id
            self.request_step[inp.msg_id] = i
        img = a.image
        img.seq = inp.seq
        rid = inp.reply_to
        if rid is not None:  # settle_ask's rules, for a delivered input
            if inp.type == "AskFailed":
                if rid in img.open_asks:
                    img.open_asks.discard(rid)
                    img.failed_asks[rid] = None
            elif rid in img.open_asks:
                img.open_asks.discard(rid)
            else:
                img.failed_asks.pop(rid, None)
        h = inp.hlc
        outs = st.outputs
        if len(outs) > 1:  # more than an empty array
            pt = int(inp.t * 1_000_000) << HLC_LOGICAL_BITS
            for o in _OUTPUTS.decode(outs):
                h = pt if pt > h else h + 1
                img.out_seq = o.msg_id
                kind = o.kind
                if kind == _TIMER:  # (kept as read: most are cancelled, re-armed or fired by T)
                    self.timers[(addr, str(o.key))] = (i, o, h, inp.t)
                elif kind == _CANCEL:
                    self.timers.pop((addr, str(o.key)), None)
                elif kind == _SEND:
                    if o.ask:
                        img.open_asks.add(o.msg_id)
                    elif o.dst == METRICS_ADDR and o.type in TERMINAL_TYPES:
                        self.terminal_at.append(self.delivered)
            a.unsure = False
        img.hlc = h
        evs = st.events
        if len(evs) > 1:
            evs = bytes(evs)
            a.raw_events.append(evs)
            if _SYSTEM(evs):
                self._system(a, inp, evs)
        if st.snapshot is not None:
            a.snap = (st.snapshot[2], st.snapshot[3])
            a.raw_events = []

    def _system(self, a: _Actor, inp: Any, evs: bytes) -> None:
        for ev in _EVENTS.decode(evs):
            if ev.type == "Stopped":
                addr = inp.actor
                del self.live[addr]
                self.retired[addr] = inp.seq
                for k in [k for k in self.timers if k[0] == addr]:
                    del self.timers[k]
                return
            if ev.type == "Restarted":
                a.image.restart_times.append(inp.t)
            elif ev.type == "HandlerFailed":
                a.unsure = True

    # ---- after the pass --------------------------------------------------
    def unsure(self) -> list[str]:
        return [addr for addr, a in self.live.items() if a.unsure]

    def images(self) -> list[CellImage]:
        """The live actors at T, each with its snapshot and events decoded, in cell order."""
        out = []
        for a in self.live.values():
            img = a.image
            load_logged_class(img.started.cls)  # its module registers its events' types
            if a.snap is not None:
                img.snap_state = msgspec.msgpack.decode(a.snap[1], type=_state_type(img.addr, a.snap[0]))
                img.snap_bytes = a.snap[1]
            events, n_bytes = [], 0
            for raw in a.raw_events:
                for ev in _EVENTS.decode(raw):
                    event = decode(ev.type, ev.payload)
                    if type(event) is Raw:
                        raise ReplayError(f"--from: {img.addr}: event type {ev.type!r} is not registered")
                    if event.system:
                        continue
                    events.append(event)
                    n_bytes += len(ev.payload)
            img.events_since, img.event_bytes = events, n_bytes
            out.append(img)
        return out

    def pending_timers(self) -> list[Timer]:
        """The timers armed by T and due after it, in the order they were armed, their messages decoded."""
        live = []
        for (addr, key), (i, o, h, t) in self.timers.items():
            deadline = t + o.delay  # as the driver computes it
            if deadline > self.until_s:
                env = Envelope(addr, addr, o.msg_id, h, o.corr, decode(o.type, o.payload), o.reply_to)
                env.payload = o.payload
                live.append(Timer((i, o.idx), deadline, env, key))
        return sorted(live, key=lambda tm: tm.order)

    def delivered_at(self, step: int) -> int:
        """The deliveries among the first `step` steps."""
        return self.delivered_by[step - 1] if step else 0

    def boundary(self, t: float, first_id: int | None = None) -> int:
        """How many steps the original had made when its `run(until=t)` returned and it injected
        a window whose first request (external id `first_id`) arrives at `t`: the steps up to `t`,
        less those the window's own requests at `t` caused (from its first one's delivery on)."""
        n = bisect_right(self.times, t)
        at = self.request_step.get(first_id) if first_id is not None else None
        return n if at is None else min(n, at)


__all__ = ["Cut", "Timer"]
