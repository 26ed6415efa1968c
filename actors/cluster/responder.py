"""The TE shell's heartbeat fan-out (xDeepServe §6.1, second hop), at `{te}/hb`.

The monitor sends each `Heartbeat` here (a child of the pod beside the shell, so the shell's
own state and dispatch stay untouched; a `Heartbeat` sent to the shell is forwarded here); this actor asks every DP master `DpHeartbeat` with a
timeout and acks the monitor once all answered — or nacks naming the master that did not. It
remembers, per master, the forward pass outstanding at the last answer, which the master uses
to tell a stalled loop from a busy one (`liveness.py`).

A leased round (`Heartbeat.lease_s` > 0, heartbeat.py): every master that answered has its NPU
probed with a lease — the device promises the monitor word of any fault within `lease_s` — and
the ack says until when the answer holds (`lease_until_s`).
"""

from __future__ import annotations

import msgspec

from deepserve.actors.ports.npu import NpuError, NpuProbe, NpuStatus
from deepserve.core import Actor, AskFailed, Context, Event, Message

from .messages import (
    DEVICE_LOST,
    HUNG,
    DpHeartbeat,
    DpHeartbeatAck,
    HbDropDp,
    Heartbeat,
    HeartbeatAck,
)


class HbState(msgspec.Struct, kw_only=True):
    seq: int = 0  # the round in flight (0: none)
    reply_to: str = ""
    asks: list[int] = []  # request id of each master's ask, by DP group
    probes: dict[str, int] = {}  # str(request id) of an NPU probe -> its DP group (masters in a run)
    probe_steps: dict[str, int] = {}  # str(dp) -> the step its master answered (a leased round's probe)
    answers: dict[str, int] = {}  # str(dp) -> the step it reported this round
    last_steps: list[int] = []  # per DP group: the step reported at its last answer (-1: none)
    rounds: int = 0
    failed_rounds: int = 0
    lease_s: float = 0.0  # the round in flight's lease (0: none)
    lease_until_s: float = 0.0


class HbDroppingState(HbState, kw_only=True):
    """The state once the manager dropped a DP group (HbDropDp: the recovery ladder's vertical
    scaling); a plain `HbState` until then, so a run without one logs what it logged before."""

    dropped: list[int] = []  # DP groups no longer asked


class HbRound(Event, frozen=True, kw_only=True):
    seq: int
    reply_to: str
    asks: tuple[int, ...]
    lease_s: float = 0.0
    lease_until_s: float = 0.0  # the round's start plus its lease: no device's promise ends sooner


class HbAnswer(Event, frozen=True, kw_only=True):
    dp: int
    step: int


class HbRoundEnded(Event, frozen=True, kw_only=True):
    ok: bool
    # ok: every DP group's step this round (the last answer's HbAnswer is folded in here: one
    # event less per TE and round)
    steps: tuple[int, ...] = ()


class HbDpDropped(Event, frozen=True, kw_only=True):
    dp: int


class HbProbing(Event, frozen=True, kw_only=True):
    """A master answered from inside an aggregated run: its NPU is asked instead (`liveness.py`)."""

    dp: int
    ask: int
    step: int = -2  # the step the master answered with (-2: as at its last answer, inside a run)


class HbResponder(Actor[HbState]):
    def __init__(self, te: str, generation: int, dp_groups: int, timeout_s: float,
                 npus: tuple[str, ...] = ()) -> None:  # fmt: skip
        if dp_groups < 1 or not timeout_s > 0:
            raise ValueError("HbResponder: dp_groups >= 1 and timeout_s > 0")
        if npus and len(npus) != dp_groups:
            raise ValueError("HbResponder: one NPU (the first of its DP group's) per DP group")
        self.te, self.generation, self.timeout_s = te, generation, timeout_s
        self.masters = tuple(f"{te}/dp/{i}" for i in range(dp_groups))
        self.npus = tuple(npus)

    def initial_state(self) -> HbState:
        return HbState(last_steps=[-1] * len(self.masters))

    def evolve(self, s: HbState, e: Event) -> HbState:
        if isinstance(e, HbRound):
            s.seq, s.reply_to, s.asks, s.answers, s.probes = e.seq, e.reply_to, list(e.asks), {}, {}
            s.probe_steps = {}
            s.lease_s, s.lease_until_s = e.lease_s, e.lease_until_s
            s.rounds += 1
        elif isinstance(e, HbProbing):
            s.probes[str(e.ask)] = e.dp
            if e.step != -2:
                s.probe_steps[str(e.dp)] = e.step
        elif isinstance(e, HbAnswer):
            s.answers[str(e.dp)] = e.step
            s.last_steps[e.dp] = e.step
        elif isinstance(e, HbDpDropped):
            if not isinstance(s, HbDroppingState):
                s = HbDroppingState(**{f: getattr(s, f) for f in HbState.__struct_fields__})
            s.dropped.append(e.dp)
        elif isinstance(e, HbRoundEnded):
            for dp, step in enumerate(e.steps):
                s.last_steps[dp] = step
            s.seq, s.asks, s.answers, s.probes, s.probe_steps = 0, [], {}, {}, {}
            s.failed_rounds += not e.ok
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        st = self.state
        if isinstance(msg, Heartbeat):
            # A round still open is superseded: the monitor counted it as a miss already.
            asks = tuple(ctx.ask(m, DpHeartbeat(seq=msg.seq, last_step=st.last_steps[i]), self.timeout_s)
                         for i, m in enumerate(self.masters) if i not in dropped(st))  # fmt: skip
            lease = msg.lease_s if self.npus else 0.0  # no NPU to promise: no lease
            ctx.record(HbRound(seq=msg.seq, reply_to=msg.reply_to, asks=asks, lease_s=lease,
                               lease_until_s=ctx.now() + lease if lease else 0.0))  # fmt: skip
        elif isinstance(msg, HbDropDp):
            if 0 <= msg.dp < len(self.masters) and msg.dp not in dropped(st):
                ctx.record(HbDpDropped(dp=msg.dp))
        elif isinstance(msg, DpHeartbeatAck):
            if msg.seq != st.seq or str(msg.dp) in st.answers or msg.dp in dropped(st):
                return
            if msg.failed:
                self._end(ctx, False, f"{self.masters[msg.dp]}: {msg.failed}", (), DEVICE_LOST)
                return
            if (msg.in_run or st.lease_s) and self.npus:
                probe = NpuProbe(req_id=f"hb:{msg.seq}:{msg.dp}", lease_s=st.lease_s,
                                 lease_to=st.reply_to if st.lease_s else "",
                                 lease_key=lease_key(self.te, self.generation) if st.lease_s else "")  # fmt: skip
                ask = ctx.ask(self.npus[msg.dp], probe, self.timeout_s)
                ctx.record(HbProbing(dp=msg.dp, ask=ask, step=-2 if msg.in_run else msg.step))
                return
            if msg.in_run:  # no NPU to probe (a responder built without them): as before, silence
                return
            self._answered(ctx, msg.dp, msg.step)
        elif isinstance(msg, NpuStatus | NpuError) and st.seq and msg.req_id.startswith(f"hb:{st.seq}:"):
            dp = int(msg.req_id.rpartition(":")[2])
            if str(dp) in st.answers:
                return
            if isinstance(msg, NpuError):
                self._end(ctx, False, f"{self.masters[dp]}: device lost: {msg.device}: {msg.kind}: {msg.reason}", (),
                          DEVICE_LOST)  # fmt: skip
                return
            # inside a run: the device works through it (the step as at the last answer)
            self._answered(ctx, dp, st.probe_steps.get(str(dp), st.last_steps[dp]))
        elif isinstance(msg, AskFailed) and st.seq and msg.request_id in st.asks:
            why = f"{msg.target} did not answer the heartbeat: {msg.reason}"
            self._end(ctx, False, why, (), HUNG)
        elif isinstance(msg, AskFailed) and st.seq and str(msg.request_id) in st.probes:
            dp = st.probes[str(msg.request_id)]
            where = "answered, but" if str(dp) in st.probe_steps else "is inside a run"  # a leased round's probe
            why = f"{self.masters[dp]} {where} its NPU {msg.target} does not answer: {msg.reason}"
            self._end(ctx, False, why, (), HUNG)

    def _answered(self, ctx: Context, dp: int, step: int) -> None:
        answers, gone = self.state.answers, dropped(self.state)
        if len(answers) + 1 < len(self.masters) - len(gone):
            ctx.record(HbAnswer(dp=dp, step=step))
            return
        steps = tuple(step if i == dp else -1 if i in gone else answers[str(i)] for i in range(len(self.masters)))
        self._end(ctx, True, "", steps)

    def _end(self, ctx: Context, ok: bool, reason: str, steps: tuple[int, ...], diagnosis: str = "") -> None:
        st = self.state
        seq, to, lease = st.seq, st.reply_to, st.lease_until_s if ok else 0.0
        ctx.record(HbRoundEnded(ok=ok, steps=steps if ok else ()))
        ctx.send(to, HeartbeatAck(te=self.te, generation=self.generation, seq=seq, ok=ok, reason=reason, steps=steps,
                                  diagnosis=diagnosis, lease_until_s=lease))  # fmt: skip


def dropped(st: HbState) -> list[int]:
    return st.dropped if isinstance(st, HbDroppingState) else []


def lease_key(te: str, generation: int) -> str:
    """What a device's lease names: the TE's generation (`te#generation`); a killed pod voids
    every lease of its TE by the prefix `te#`."""
    return f"{te}#{generation}"
