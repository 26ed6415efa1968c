"""The heartbeat monitor (xDeepServe §6.1, first tier): control plane → TE shell → DP masters.

Every `interval_s` it sends each watched TE's shell a `Heartbeat`; the shell's fan-out (`{te}/hb`)
acks once every DP master answered, and a master answers only while its loop moves
(`liveness.py`). A tick with no answer since the last one is a miss (an answer to an earlier ping
counts: it arrived late, but the TE lives); `misses` in a row and the monitor
sends `TeFailed` to the cluster manager (which replaces the TE) and stops watching it. A dead
TE (its actors stopped, its process killed) misses the same way. The manager tells the monitor
what to watch (`WatchTe` / `UnwatchTe`); ticks run only while something is watched, and
`StopMonitor` ends them, so a simulation's clock is not kept running by heartbeats.
"""

from __future__ import annotations

import msgspec

from deepserve.core import Actor, Context, Event, Message

from .messages import (
    Heartbeat,
    HeartbeatAck,
    HeartbeatTick,
    StopMonitor,
    TeFailed,
    UnwatchTe,
    WatchTe,
)
from .policy import Watched, heartbeat_tick

TICK = "tick"


class MonitorConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    manager: str = "cm"
    interval_s: float = 1.0
    misses: int = 3

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"cluster.heartbeat_interval_s: must be > 0, got {self.interval_s}")
        if not 1 <= self.misses <= 1000:
            raise ValueError(f"cluster.heartbeat_misses: must be in [1, 1000], got {self.misses}")


class MonitorState(msgspec.Struct, kw_only=True):
    watched: dict[str, Watched] = {}
    seq: int = 0
    ticking: bool = False
    stopped: bool = False
    declared: int = 0


class HbWatch(Event, frozen=True, kw_only=True):
    te: str
    generation: int


class HbUnwatch(Event, frozen=True, kw_only=True):
    te: str


class HbTicked(Event, frozen=True, kw_only=True):
    seq: int
    missed: tuple[tuple[str, int, str], ...]
    failed: tuple[str, ...]
    pinged: tuple[str, ...]


class HbAcked(Event, frozen=True, kw_only=True):
    te: str
    seq: int
    ok: bool
    reason: str = ""


class HbTicking(Event, frozen=True, kw_only=True):
    on: bool
    stopped: bool = False


def _evolve(s: MonitorState, e: Event) -> MonitorState:
    if isinstance(e, HbWatch):
        s.watched[e.te] = Watched(generation=e.generation)
    elif isinstance(e, HbUnwatch):
        s.watched.pop(e.te, None)
    elif isinstance(e, HbTicked):
        s.seq = e.seq
        for te, n, why in e.missed:
            s.watched[te].misses, s.watched[te].reason = n, why
        for te in e.failed:
            del s.watched[te]
            s.declared += 1
        for te in e.pinged:
            s.watched[te].sent, s.watched[te].reason = e.seq, ""
    elif isinstance(e, HbAcked):
        w = s.watched[e.te]
        if e.ok:
            w.acked, w.misses = e.seq, 0
        else:
            w.reason = e.reason
    elif isinstance(e, HbTicking):
        s.ticking = e.on
        s.stopped = s.stopped or e.stopped
    return s


class HeartbeatMonitor(Actor[MonitorState]):
    def __init__(self, config: dict[str, object] | None = None) -> None:
        self.cfg = msgspec.convert(config or {}, MonitorConfig)

    def initial_state(self) -> MonitorState:
        return MonitorState()

    def evolve(self, s: MonitorState, e: Event) -> MonitorState:
        return _evolve(s, e)

    def handle(self, ctx: Context, msg: Message) -> None:
        st = self.state
        if isinstance(msg, WatchTe):
            if st.stopped:
                return
            ctx.record(HbWatch(te=msg.te, generation=msg.generation))
            if not st.ticking:
                ctx.record(HbTicking(on=True))
                ctx.after(self.cfg.interval_s, HeartbeatTick(), key=TICK)
        elif isinstance(msg, UnwatchTe) and msg.te in st.watched:
            ctx.record(HbUnwatch(te=msg.te))
        elif isinstance(msg, HeartbeatTick):
            self._tick(ctx)
        elif isinstance(msg, HeartbeatAck):
            w = st.watched.get(msg.te)
            # A late answer (to an earlier ping) is still a sign of life: misses count ticks in a
            # row with no answer at all, so a loaded but live TE is not declared failed.
            if w is not None and w.generation == msg.generation and w.acked < msg.seq <= w.sent:
                ctx.record(HbAcked(te=msg.te, seq=msg.seq, ok=msg.ok, reason=msg.reason))
        elif isinstance(msg, StopMonitor) and not st.stopped:
            ctx.cancel(TICK)
            ctx.record(HbTicking(on=False, stopped=True))

    def _tick(self, ctx: Context) -> None:
        st, cfg = self.state, self.cfg
        if st.stopped:
            return
        out = heartbeat_tick(st.watched, cfg.misses, cfg.interval_s)
        seq = st.seq + 1
        gens = {te: st.watched[te].generation for te, _, _ in out.failed}
        ctx.record(HbTicked(seq=seq, missed=out.missed, failed=tuple(te for te, _, _ in out.failed), pinged=out.ping))
        for te, gen, reason in out.failed:
            ctx.send(cfg.manager, TeFailed(te=te, generation=gens.get(te, gen), reason=reason))
        for te in out.ping:
            ctx.send(te, Heartbeat(te=te, generation=st.watched[te].generation, seq=seq, reply_to=ctx.self))
        if st.watched:
            ctx.after(cfg.interval_s, HeartbeatTick(), key=TICK)
        else:
            ctx.record(HbTicking(on=False))
