"""The heartbeat monitor (xDeepServe §6.1, first tier): control plane → TE shell → DP masters.

Every `interval_s` it sends each watched TE's shell fan-out (`{te}/hb`) a `Heartbeat`, which
acks once every DP master answered, and a master answers only while its loop moves
(`liveness.py`). A tick with no answer since the last one is a miss (an answer to an earlier ping
counts: it arrived late, but the TE lives); `misses` in a row and the monitor
sends `TeFailed` to the cluster manager (which replaces the TE) and stops watching it. A dead
TE (its actors stopped, its process killed) misses the same way. The manager tells the monitor
what to watch (`WatchTe` / `UnwatchTe`); ticks run only while something is watched, and
`StopMonitor` ends them, so a simulation's clock is not kept running by heartbeats.

Idle backoff (`idle_max_interval_s` > 0, the daemon's): a round in which every TE answered and
none had a forward pass outstanding (`HeartbeatAck.steps` all -1) doubles the next interval, up
to `idle_max_interval_s`; any busy answer, miss or failure brings it back to `interval_s`. An idle
daemon otherwise logs a heartbeat round a second (~13 KB/s, ~1 GB a day, measured). The frontend
sends `HeartbeatWake` when a request arrives while the interval is backed off: the next tick is
then one `interval_s` away, so a TE that died while idle is found as fast as under load once
traffic is back. Every decision is a recorded event (`HbTicked.next_s`, `HbAcked.busy`, `HbWoken`).

Leases (`lease_s` > 0): asking every TE every interval costs a simulation as many deliveries as
its requests (16 TEs, an hour: ~57,000 rounds of 5 deliveries). A leased round probes each DP
group's NPU with a promise: the device tells the monitor (`NpuLeaseBroken`) if it crashes,
hangs, is reset or faults within `lease_s`, and the pod launcher voids the TE's leases when it
kills the pod; the monitor then leaves the TE alone until the lease ends. Only those events can
make a healthy device's TE stop answering (a master's loop waits on nothing else), so every round
skipped would have been answered ok. A broken lease is no verdict: it brings the next tick within
one interval and the TE is asked again, so a hang is still found within misses x interval (liveness.stalled_past_limit)
and a crash at the first round after it — the verdicts come from answers and silence as before.
A heartbeat-loss fault breaks the lease too. A lease also ends on its own after `lease_s` (a
stall no device reports — a stopped process in the daemon — is found within `lease_s` plus the
misses). When every TE is leased the next tick is at the first lease's end, not each interval.

Device watch (`device_watch`): the pings are `DeviceHeartbeat`s, whose responder holds a lease
on each DP group's NPU (responder.py): a device that crashes under an idle TE — whose masters run
no pass that could fail — is reported in the next round's answer (`DEVICE_LOST`, declared at once),
within one interval of the crash, at no delivery per round. A hang under an idle TE is found by
the same lease: the responder's re-probe is bounded by misses x interval (`hang_after_s`, a busy
TE's hang bound) and its verdict (`DeviceVerdictAck`, `HUNG`) is declared at once.
"""

from __future__ import annotations

import math

import msgspec

from deepserve.actors.ports.npu import NpuLeaseBroken
from deepserve.core import Actor, Context, Event, Message

from .liveness import stalled_past_limit
from .messages import (
    DEVICE_LOST,
    SILENT,
    Heartbeat,
    HeartbeatAck,
    HeartbeatTick,
    LoseHeartbeats,
    StopMonitor,
    TeFailed,
    UnwatchTe,
    WatchTe,
)
from .policy import TickOutcome, Watched, heartbeat_tick
from .responder import DeviceHeartbeat, DeviceVerdictAck

TICK = "tick"


class MonitorConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    manager: str = "cm"
    interval_s: float = 1.0
    misses: int = 3
    idle_max_interval_s: float = 0.0  # 0: no idle backoff (simulations)
    lease_s: float = 0.0  # 0: no leases (every TE asked every interval)
    # each TE's responder watches its NPUs through a lease (responder.py, `DeviceHeartbeat`): a
    # crash on an idle TE is found at the next round, not only by a forward pass that fails
    device_watch: bool = False

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"cluster.heartbeat_interval_s: must be > 0, got {self.interval_s}")
        if not 1 <= self.misses <= 1000:
            raise ValueError(f"cluster.heartbeat_misses: must be in [1, 1000], got {self.misses}")
        if self.idle_max_interval_s and not self.interval_s <= self.idle_max_interval_s <= 86_400:
            raise ValueError(f"control.heartbeat_idle_max_interval_s: must be 0 (off) or in "
                             f"[heartbeat_interval_s, 86400], got {self.idle_max_interval_s}")  # fmt: skip
        if self.lease_s and not self.interval_s <= self.lease_s <= 86_400:
            raise ValueError(f"control.heartbeat_lease_s: must be 0 (off) or in [heartbeat_interval_s, 86400], "
                             f"got {self.lease_s}")  # fmt: skip


class MonitorState(msgspec.Struct, kw_only=True):
    watched: dict[str, Watched] = {}
    seq: int = 0
    ticking: bool = False
    stopped: bool = False
    declared: int = 0
    interval_s: float = 0.0  # the current tick interval under idle backoff (0: the configured one)
    busy: bool = False  # an answer since the last tick had a forward pass outstanding
    lost_until: dict[str, float] = {}  # te -> until when its answers are lost (a fault)
    # te -> the heartbeat round from which its silence, diagnosed a hang, counts as a stall: its
    # last ok answer's, when that had a forward pass outstanding; the round before its lease broke
    # (the device said something happened then). Absent: misses alone count (liveness.py).
    stall_from: dict[str, int] = {}


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
    next_s: float = 0.0  # the interval to the next tick when not the configured one (idle backoff, leases)


class HbAcked(Event, frozen=True, kw_only=True):
    te: str
    seq: int
    ok: bool
    reason: str = ""
    busy: bool = False  # a DP master had a forward pass outstanding
    diagnosis: str = ""
    lease_until_s: float = 0.0  # ok and leased: left alone until then


class HbLeaseBroken(Event, frozen=True, kw_only=True):
    """A TE's lease is off (a device's fault, its pod killed, heartbeat loss): asked again at the
    next tick, which `soon` brings within one interval."""

    te: str
    reason: str
    soon: bool = False


class HbDeclared(Event, frozen=True, kw_only=True):
    """A TE said its device is lost: declared failed at once, not after `misses` rounds."""

    te: str
    reason: str


class HbWoken(Event, frozen=True, kw_only=True):
    """A request arrived while backed off (or a TE is watched while every other one is leased):
    the next tick is one base interval away."""


class HeartbeatWake(Message, frozen=True, kw_only=True):
    """From the frontend: traffic again after an idle spell (see the module docstring)."""


class HbLossStarted(Event, frozen=True, kw_only=True):
    """A `heartbeat-loss` fault: the TE's answers arriving before `until_s` are dropped."""

    te: str
    until_s: float


class HbTicking(Event, frozen=True, kw_only=True):
    on: bool
    stopped: bool = False


def _evolve(s: MonitorState, e: Event) -> MonitorState:
    if isinstance(e, HbWatch):
        s.watched[e.te] = Watched(generation=e.generation)
    elif isinstance(e, HbUnwatch):
        s.watched.pop(e.te, None)
        s.stall_from.pop(e.te, None)
    elif isinstance(e, HbTicked):
        s.seq, s.interval_s, s.busy = e.seq, e.next_s, False
        for te, n, why in e.missed:
            s.watched[te].misses, s.watched[te].reason = n, why
        for te in e.failed:
            del s.watched[te]
            s.stall_from.pop(te, None)
            s.declared += 1
        for te in e.pinged:
            s.watched[te].sent, s.watched[te].reason = e.seq, ""
    elif isinstance(e, HbAcked):
        w = s.watched[e.te]
        if e.ok:
            w.acked, w.misses, w.lease_until = e.seq, 0, e.lease_until_s
            if e.busy:
                s.stall_from[e.te] = e.seq
            else:
                s.stall_from.pop(e.te, None)
        else:
            w.reason, w.diagnosis = e.reason, e.diagnosis
        s.busy = s.busy or e.busy
    elif isinstance(e, HbDeclared):
        del s.watched[e.te]
        s.stall_from.pop(e.te, None)
        s.declared += 1
    elif isinstance(e, HbLossStarted):
        s.lost_until[e.te] = e.until_s
    elif isinstance(e, HbWoken):
        s.interval_s = 0.0
    elif isinstance(e, HbLeaseBroken):
        s.watched[e.te].lease_until = 0.0
        s.stall_from[e.te] = s.seq
        if e.soon:
            s.interval_s = 0.0
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
            elif self.cfg.lease_s and st.interval_s > self.cfg.interval_s:  # the far tick of leased TEs
                ctx.record(HbWoken())
                ctx.after(self.cfg.interval_s, HeartbeatTick(), key=TICK)
        elif isinstance(msg, UnwatchTe) and msg.te in st.watched:
            ctx.record(HbUnwatch(te=msg.te))
        elif isinstance(msg, HeartbeatTick):
            self._tick(ctx)
        elif isinstance(msg, LoseHeartbeats):
            ctx.record(HbLossStarted(te=msg.te, until_s=ctx.now() + msg.duration_s))
            self._break_lease(ctx, msg.te, -1, "heartbeat loss")
        elif isinstance(msg, NpuLeaseBroken):
            te, _, gen = msg.key.rpartition("#")
            self._break_lease(ctx, te, int(gen) if gen.isdigit() else -2, msg.reason)
        elif isinstance(msg, HeartbeatAck):
            if ctx.now() < st.lost_until.get(msg.te, -1.0):
                return  # lost on the way (a fault): as if never sent
            w = st.watched.get(msg.te)
            # A late answer (to an earlier ping) is still a sign of life: misses count ticks in a
            # row with no answer at all, so a loaded but live TE is not declared failed.
            if w is not None and w.generation == msg.generation and w.acked < msg.seq <= w.sent:
                busy = any(step >= 0 for step in msg.steps)
                ctx.record(HbAcked(te=msg.te, seq=msg.seq, ok=msg.ok, reason=msg.reason, busy=busy,
                                   diagnosis=msg.diagnosis, lease_until_s=msg.lease_until_s))  # fmt: skip
                if msg.diagnosis == DEVICE_LOST or isinstance(msg, DeviceVerdictAck):
                    self._declare_lost(ctx, msg)
        elif isinstance(msg, HeartbeatWake):
            if st.interval_s > self.cfg.interval_s and st.ticking and not st.stopped:
                ctx.record(HbWoken())
                ctx.after(self.cfg.interval_s, HeartbeatTick(), key=TICK)  # replaces the far one
        elif isinstance(msg, StopMonitor) and not st.stopped:
            ctx.cancel(TICK)
            ctx.record(HbTicking(on=False, stopped=True))

    def _tick(self, ctx: Context) -> None:
        st, cfg = self.state, self.cfg
        if st.stopped:
            return
        now = ctx.now()
        seq = st.seq + 1
        out = heartbeat_tick(st.watched, cfg.misses, cfg.interval_s, now)
        out = stalled_past_limit(out, st.watched, st.stall_from, seq, cfg.misses)
        gens = {te: st.watched[te].generation for te, _, _ in out.failed}
        diagnoses = {te: st.watched[te].diagnosis or SILENT for te, _, _ in out.failed}
        nxt = self._next_interval(out)
        if not out.ping and not out.missed and not out.failed and st.watched:
            # every TE leased: the next tick at the first lease's end (a whole number of intervals)
            first = min(w.lease_until for w in st.watched.values())
            nxt = max(nxt, cfg.interval_s * math.ceil((first - now) / cfg.interval_s - 1e-9))
        ctx.record(HbTicked(seq=seq, missed=out.missed, failed=tuple(te for te, _, _ in out.failed), pinged=out.ping,
                            next_s=nxt if cfg.idle_max_interval_s or nxt != cfg.interval_s else 0.0))  # fmt: skip
        for te, gen, reason in out.failed:
            ctx.send(cfg.manager, TeFailed(te=te, generation=gens.get(te, gen), reason=reason, diagnosis=diagnoses[te]))
        for te in out.ping:
            # Straight to the TE shell's fan-out (`{te}/hb`, responder.py): through the shell it
            # was one more delivery per TE and round, for a forward.
            gen = st.watched[te].generation
            if cfg.device_watch:  # a device silent for the misses' span is hung, as a busy TE's loop
                ping: Heartbeat = DeviceHeartbeat(te=te, generation=gen, seq=seq, reply_to=ctx.self, lease_s=cfg.lease_s,
                                                  hang_after_s=cfg.misses * cfg.interval_s)  # fmt: skip
            else:
                ping = Heartbeat(te=te, generation=gen, seq=seq, reply_to=ctx.self, lease_s=cfg.lease_s)
            ctx.send(f"{te}/hb", ping)
        if st.watched:
            ctx.after(nxt, HeartbeatTick(), key=TICK)
        else:
            ctx.record(HbTicking(on=False))

    def _break_lease(self, ctx: Context, te: str, generation: int, reason: str) -> None:
        """`generation` -1: whichever is watched. A far tick (every TE was leased) is brought
        within one interval, as a wake does; otherwise the next tick asks the TE anyway."""
        st, cfg = self.state, self.cfg
        w = st.watched.get(te)
        if w is None or w.lease_until <= ctx.now() or generation not in (-1, w.generation) or st.stopped:
            return
        soon = st.ticking and st.interval_s > cfg.interval_s
        ctx.record(HbLeaseBroken(te=te, reason=reason, soon=soon))
        if soon:
            ctx.after(cfg.interval_s, HeartbeatTick(), key=TICK)  # replaces the far one

    def _declare_lost(self, ctx: Context, msg: HeartbeatAck) -> None:
        """A master whose loop runs said its device is lost (crashed, reset, HBM faulted), or
        the device watch found it hung past the misses' bound: no later round can answer
        otherwise, so waiting `misses` rounds only routes more tasks to a TE that fails them.
        The diagnosis is the TE's own, not inferred from silence."""
        why = f"its heartbeat said: {msg.reason}"
        ctx.record(HbDeclared(te=msg.te, reason=why))
        ctx.send(self.cfg.manager, TeFailed(te=msg.te, generation=msg.generation, reason=why, diagnosis=msg.diagnosis))
        if not self.state.watched and self.state.ticking:
            ctx.cancel(TICK)
            ctx.record(HbTicking(on=False))

    def _next_interval(self, out: TickOutcome) -> float:
        """Idle backoff: twice the current interval (at most `idle_max_interval_s`) after a
        quiet round — every TE answered, none busy, no miss — else the configured interval."""
        st, cfg = self.state, self.cfg
        if not cfg.idle_max_interval_s:
            return cfg.interval_s
        answered = all(w.acked == w.sent for w in st.watched.values())
        if st.busy or out.missed or out.failed or not answered:
            return cfg.interval_s
        return min(cfg.idle_max_interval_s, 2 * (st.interval_s or cfg.interval_s))
