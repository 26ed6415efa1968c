"""The TE shell's heartbeat fan-out (xDeepServe §6.1, second hop), at `{te}/hb`.

The monitor sends each `Heartbeat` here (a child of the pod beside the shell, so the shell's
own state and dispatch stay untouched; a `Heartbeat` sent to the shell is forwarded here); this actor asks every DP master `DpHeartbeat` with a
timeout and acks the monitor once all answered — or nacks naming the master that did not. It
remembers, per master, the forward pass outstanding at the last answer, which the master uses
to tell a stalled loop from a busy one (`liveness.py`).
"""

from __future__ import annotations

import msgspec

from deepserve.actors.ports.npu import NpuError, NpuProbe, NpuStatus
from deepserve.core import Actor, AskFailed, Context, Event, Message

from .messages import DEVICE_LOST, HUNG, DpHeartbeat, DpHeartbeatAck, Heartbeat, HeartbeatAck


class HbState(msgspec.Struct, kw_only=True):
    seq: int = 0  # the round in flight (0: none)
    reply_to: str = ""
    asks: list[int] = []  # request id of each master's ask, by DP group
    probes: dict[str, int] = {}  # str(request id) of an NPU probe -> its DP group (masters in a run)
    answers: dict[str, int] = {}  # str(dp) -> the step it reported this round
    last_steps: list[int] = []  # per DP group: the step reported at its last answer (-1: none)
    rounds: int = 0
    failed_rounds: int = 0


class HbRound(Event, frozen=True, kw_only=True):
    seq: int
    reply_to: str
    asks: tuple[int, ...]


class HbAnswer(Event, frozen=True, kw_only=True):
    dp: int
    step: int


class HbRoundEnded(Event, frozen=True, kw_only=True):
    ok: bool
    # ok: every DP group's step this round (the last answer's HbAnswer is folded in here: one
    # event less per TE and round)
    steps: tuple[int, ...] = ()


class HbProbing(Event, frozen=True, kw_only=True):
    """A master answered from inside an aggregated run: its NPU is asked instead (`liveness.py`)."""

    dp: int
    ask: int


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
            s.rounds += 1
        elif isinstance(e, HbProbing):
            s.probes[str(e.ask)] = e.dp
        elif isinstance(e, HbAnswer):
            s.answers[str(e.dp)] = e.step
            s.last_steps[e.dp] = e.step
        elif isinstance(e, HbRoundEnded):
            for dp, step in enumerate(e.steps):
                s.last_steps[dp] = step
            s.seq, s.asks, s.answers, s.probes = 0, [], {}, {}
            s.failed_rounds += not e.ok
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        st = self.state
        if isinstance(msg, Heartbeat):
            # A round still open is superseded: the monitor counted it as a miss already.
            asks = tuple(ctx.ask(m, DpHeartbeat(seq=msg.seq, last_step=st.last_steps[i]), self.timeout_s)
                         for i, m in enumerate(self.masters))  # fmt: skip
            ctx.record(HbRound(seq=msg.seq, reply_to=msg.reply_to, asks=asks))
        elif isinstance(msg, DpHeartbeatAck):
            if msg.seq != st.seq or str(msg.dp) in st.answers:
                return
            if msg.failed:
                self._end(ctx, False, f"{self.masters[msg.dp]}: {msg.failed}", (), DEVICE_LOST)
                return
            if msg.in_run and self.npus:
                ask = ctx.ask(self.npus[msg.dp], NpuProbe(req_id=f"hb:{msg.seq}:{msg.dp}"), self.timeout_s)
                ctx.record(HbProbing(dp=msg.dp, ask=ask))
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
            self._answered(ctx, dp, st.last_steps[dp])  # the device works through the run
        elif isinstance(msg, AskFailed) and st.seq and msg.request_id in st.asks:
            why = f"{msg.target} did not answer the heartbeat: {msg.reason}"
            self._end(ctx, False, why, (), HUNG)
        elif isinstance(msg, AskFailed) and st.seq and str(msg.request_id) in st.probes:
            dp = st.probes[str(msg.request_id)]
            why = f"{self.masters[dp]} is inside a run its NPU {msg.target} does not answer: {msg.reason}"
            self._end(ctx, False, why, (), HUNG)

    def _answered(self, ctx: Context, dp: int, step: int) -> None:
        answers = self.state.answers
        if len(answers) + 1 < len(self.masters):
            ctx.record(HbAnswer(dp=dp, step=step))
            return
        steps = tuple(step if i == dp else answers[str(i)] for i in range(len(self.masters)))
        self._end(ctx, True, "", steps)

    def _end(self, ctx: Context, ok: bool, reason: str, steps: tuple[int, ...], diagnosis: str = "") -> None:
        st = self.state
        seq, to = st.seq, st.reply_to
        ctx.record(HbRoundEnded(ok=ok, steps=steps if ok else ()))
        ctx.send(to, HeartbeatAck(te=self.te, generation=self.generation, seq=seq, ok=ok, reason=reason, steps=steps,
                                  diagnosis=diagnosis))  # fmt: skip
