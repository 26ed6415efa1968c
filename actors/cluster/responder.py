"""The TE shell's heartbeat fan-out (xDeepServe §6.1, second hop), at `{te}/hb`.

The monitor sends each `Heartbeat` here (a child of the pod beside the shell, so the shell's
own state and dispatch stay untouched; a `Heartbeat` sent to the shell is forwarded here); this actor asks every DP master `DpHeartbeat` with a
timeout and acks the monitor once all answered — or nacks naming the master that did not. It
remembers, per master, the forward pass outstanding at the last answer, which the master uses
to tell a stalled loop from a busy one (`liveness.py`).

A leased round (`Heartbeat.lease_s` > 0, heartbeat.py): every master that answered has its NPU
probed with a lease — the device promises the monitor word of any fault within `lease_s` — and
the ack says until when the answer holds (`lease_until_s`).

Device watch (`DeviceHeartbeat`, `control.heartbeat_device_watch`): a DP master learns that its
NPU crashed only from a forward pass that fails, so an idle TE on a crashed device answered ok
round after round and stayed in its group. At its first such round the responder probes every DP
group's NPUs once with a lease to itself (the device promises word of any fault); a broken lease
is answered by probing the device again, and a crash found so is recorded (`HbDeviceLost`) and
fails the round in flight, or else the next one, with `DEVICE_LOST` (so does an HBM fault the TE
cannot do without): the monitor declares the TE
at once (and, backed off while idle, is woken so that the next round is one base interval away).
Nothing is sent per round: a healthy device costs one probe per TE generation. Every NPU of a
DP group's TP group is watched (a crash on any of them loses the group's collective).

A hang under an idle TE: the hung device breaks the lease too, but its answer to the probe that
follows waits in its queue, and a master with no pass outstanding keeps answering. So the probe
after a broken lease is an ask bounded by `DeviceHeartbeat.hang_after_s` (the monitor's
misses x interval: a busy TE's hang bound); a device silent that long — or refusing with a full
queue, which only a hung one does — is hung (`HbDeviceHung`), and the round in flight, or the
next, fails with `HUNG` as a verdict (`DeviceVerdictAck`): declared at once, as a lost device
is. A healthy device's lease never breaks, so this costs nothing per round either.
"""

from __future__ import annotations

import msgspec

from deepserve.actors.ports.npu import (
    CRASHED,
    HBM_FAULT,
    QUEUE_FULL,
    RESET,
    NpuError,
    NpuLeaseBroken,
    NpuProbe,
    NpuStatus,
)
from deepserve.core import Actor, AskFailed, Context, Event, Message

from .health import INSTANCE, classify_hbm
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


class HbWatchingState(HbDroppingState, kw_only=True):
    """The state once the device watch is on (`HbDevicesWatched`); plain until then, so a run
    without it logs what it logged before."""

    lost: dict[str, str] = {}  # str(dp) -> why its NPU is lost (a crash seen through its lease)
    hung: list[int] = []  # DP groups whose lost NPU is hung (the rest: crashed or HBM faulted)
    hang_after_s: float = 0.0  # a re-probe unanswered this long is a hang (0: unbounded, as before)
    asking: dict[str, int] = {}  # str(NPU index) -> the request id of its bounded re-probe


class DeviceHeartbeat(Heartbeat, frozen=True, kw_only=True):
    """A `Heartbeat` under `control.heartbeat_device_watch`: the responder also watches each DP
    group's NPU through a lease (the module docstring). A type of its own, not a field: a plain
    heartbeat encodes as before."""

    hang_after_s: float = 0.0  # the monitor's misses x interval: a re-probe silent this long is a hang


class DeviceVerdictAck(HeartbeatAck, frozen=True, kw_only=True):
    """A failed round whose diagnosis is the device watch's verdict (a hang bounded by
    `hang_after_s`), not a silence to count: the monitor declares the TE at once."""


class HbDevicesWatched(Event, frozen=True, kw_only=True):
    """Each DP group's NPUs were probed with a lease to this responder."""

    npus: tuple[str, ...]
    hang_after_s: float = 0.0


class HbDeviceAsked(Event, frozen=True, kw_only=True):
    """A broken lease's re-probe, bounded by `hang_after_s` (request id `ask`)."""

    npu: int  # its index in the responder's NPUs
    ask: int


class HbDeviceHung(Event, frozen=True, kw_only=True):
    dp: int
    reason: str


class HbDeviceLost(Event, frozen=True, kw_only=True):
    dp: int
    reason: str


DEVICE_LEASE_S = 1e9  # "until the device says otherwise" (health.py's LEASE_S)
DEVICE_REQ = "dev:"  # the req_id prefix of a device watch's probes


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
        if npus and len(npus) % dp_groups:
            raise ValueError("HbResponder: as many NPUs per DP group (its TP group), group by group")
        self.te, self.generation, self.timeout_s = te, generation, timeout_s
        self.masters = tuple(f"{te}/dp/{i}" for i in range(dp_groups))
        # every NPU of the TE, DP group g's at [g*tp, (g+1)*tp) (a log before the watch covered
        # the TP group names only each group's first: tp 1)
        self.npus = tuple(npus)
        self.tp = len(npus) // dp_groups if npus else 1

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
        elif isinstance(e, HbDevicesWatched):
            s = HbWatchingState(**{f: getattr(s, f) for f in type(s).__struct_fields__}, hang_after_s=e.hang_after_s)
        elif isinstance(e, HbDeviceLost):
            s.lost[str(e.dp)] = e.reason  # type: ignore[attr-defined]
        elif isinstance(e, HbDeviceAsked):
            s.asking[str(e.npu)] = e.ask  # type: ignore[attr-defined]
        elif isinstance(e, HbDeviceHung):
            s.lost[str(e.dp)] = e.reason  # type: ignore[attr-defined]
            s.hung.append(e.dp)  # type: ignore[attr-defined]
        elif isinstance(e, HbRoundEnded):
            for dp, step in enumerate(e.steps):
                s.last_steps[dp] = step
            s.seq, s.asks, s.answers, s.probes, s.probe_steps = 0, [], {}, {}, {}
            s.failed_rounds += not e.ok
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        st = self.state
        if isinstance(msg, Heartbeat):
            if isinstance(msg, DeviceHeartbeat) and self.npus and not isinstance(st, HbWatchingState):
                self._watch_devices(ctx, msg.hang_after_s)
            lost = self._lost()
            if lost:  # its device said so already: no master can answer otherwise
                ctx.record(HbRound(seq=msg.seq, reply_to=msg.reply_to, asks=()))
                self._end(ctx, False, lost, (), *self._diagnosis())
                return
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
                ask = ctx.ask(self.npus[msg.dp * self.tp], probe, self.timeout_s)
                ctx.record(HbProbing(dp=msg.dp, ask=ask, step=-2 if msg.in_run else msg.step))
                return
            if msg.in_run:  # no NPU to probe (a responder built without them): as before, silence
                return
            self._answered(ctx, msg.dp, msg.step)
        elif isinstance(msg, NpuLeaseBroken | NpuError | NpuStatus) and isinstance(st, HbWatchingState) and \
                (isinstance(msg, NpuLeaseBroken) or msg.req_id.startswith(DEVICE_REQ)):
            self._device_said(ctx, msg)
        elif isinstance(msg, AskFailed) and isinstance(st, HbWatchingState) and msg.request_id in st.asking.values():
            self._device_hung(ctx, msg.target, f"no answer to a probe within {st.hang_after_s:g}s")
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

    # ---- device watch (DeviceHeartbeat) --------------------------------------------------------
    def _watch_devices(self, ctx: Context, hang_after_s: float) -> None:
        gone = dropped(self.state)
        idx = [i for i in range(len(self.npus)) if i // self.tp not in gone]
        ctx.record(HbDevicesWatched(npus=tuple(self.npus[i] for i in idx), hang_after_s=hang_after_s))
        for i in idx:
            self._probe_device(ctx, i)

    def _probe_device(self, ctx: Context, i: int, bounded: bool = False) -> None:
        """Probe NPU `i` with a lease to this responder; `bounded` (after a broken lease, with
        a hang bound): as an ask, whose timeout is the hang verdict."""
        probe = NpuProbe(req_id=f"{DEVICE_REQ}{i}", lease_s=DEVICE_LEASE_S, lease_to=ctx.self,
                         lease_key=lease_key(self.te, self.generation))  # fmt: skip
        bound = getattr(self.state, "hang_after_s", 0.0)
        if not (bounded and bound > 0):
            ctx.send(self.npus[i], probe)
            return
        ctx.record(HbDeviceAsked(npu=i, ask=ctx.ask(self.npus[i], probe, bound)))

    def _device_said(self, ctx: Context, msg: NpuLeaseBroken | NpuError | NpuStatus) -> None:
        """A broken lease: ask the device how it is now (and for a new lease). Its answer: a
        crash, or a faulted HBM region the TE cannot do without (health.classify_hbm: weights,
        a whole region; a part of the KV region is masked in place or fails only the requests
        that touch it), is the TE's end; a reset (a hung device's probe waited in its queue)
        asks again."""
        st = self.state
        if isinstance(msg, NpuLeaseBroken):
            if msg.key == lease_key(self.te, self.generation) and msg.device in self.npus:
                self._probe_device(ctx, self.npus.index(msg.device), bounded=True)
            return
        if msg.device not in self.npus:
            return
        i = self.npus.index(msg.device)
        dp = i // self.tp
        if isinstance(msg, NpuError) and msg.kind == RESET:
            self._probe_device(ctx, i, bounded=True)
            return
        if isinstance(msg, NpuError) and msg.kind == QUEUE_FULL:  # only a hung device refuses a probe
            self._device_hung(ctx, msg.device, msg.reason)
            return
        if isinstance(msg, NpuStatus):
            if classify_hbm(msg.faulted_regions) != INSTANCE:
                return
            why = f"{msg.device}: {HBM_FAULT}: HBM regions faulted: {', '.join(msg.faulted_regions)}"
        elif msg.kind == CRASHED:
            why = f"{msg.device}: {msg.kind}: {msg.reason}"
        else:
            return
        if str(dp) not in st.lost and dp not in dropped(st):  # type: ignore[attr-defined]
            ctx.record(HbDeviceLost(dp=dp, reason=f"{self.masters[dp]}: device lost: {why}"))
            self._verdict_out(ctx)

    def _device_hung(self, ctx: Context, npu: str, why: str) -> None:
        """NPU `npu` did not answer its bounded re-probe (or refused it, its queue full): hung."""
        st = self.state
        dp = self.npus.index(npu) // self.tp
        if str(dp) in st.lost or dp in dropped(st):  # type: ignore[attr-defined]
            return
        ctx.record(HbDeviceHung(dp=dp, reason=f"{self.masters[dp]}: device hung: {npu}: {why}"))
        self._verdict_out(ctx)

    def _verdict_out(self, ctx: Context) -> None:
        """A device verdict was just recorded: the round in flight fails now; else a monitor
        backed off while idle is woken, so that the next round (which fails) is one base
        interval away."""
        st = self.state
        if st.seq:
            self._end(ctx, False, self._lost(), (), *self._diagnosis())
        elif st.reply_to:
            from .heartbeat import HeartbeatWake  # heartbeat.py imports this module

            ctx.send(st.reply_to, HeartbeatWake())

    def _diagnosis(self) -> tuple[str, bool]:
        """The diagnosis of `_lost()`'s group, and whether it is a verdict to declare at once
        over `DeviceVerdictAck` (a hang; a lost device is declared so by its diagnosis)."""
        st = self.state
        gone = dropped(st)
        dp = next((int(dp) for dp in sorted(st.lost) if int(dp) not in gone), -1)  # type: ignore[attr-defined]
        return (HUNG, True) if dp in st.hung else (DEVICE_LOST, False)  # type: ignore[attr-defined]

    def _lost(self) -> str:
        """Why a DP group's NPU is lost (its watch saw it crash), "" when none is."""
        st = self.state
        if not isinstance(st, HbWatchingState):
            return ""
        gone = dropped(st)
        return next((why for dp, why in sorted(st.lost.items()) if int(dp) not in gone), "")

    def _answered(self, ctx: Context, dp: int, step: int) -> None:
        answers, gone = self.state.answers, dropped(self.state)
        if len(answers) + 1 < len(self.masters) - len(gone):
            ctx.record(HbAnswer(dp=dp, step=step))
            return
        steps = tuple(step if i == dp else -1 if i in gone else answers[str(i)] for i in range(len(self.masters)))
        self._end(ctx, True, "", steps)

    def _end(self, ctx: Context, ok: bool, reason: str, steps: tuple[int, ...], diagnosis: str = "",
             verdict: bool = False) -> None:  # fmt: skip
        st = self.state
        seq, to, lease = st.seq, st.reply_to, st.lease_until_s if ok else 0.0
        ctx.record(HbRoundEnded(ok=ok, steps=steps if ok else ()))
        ack = DeviceVerdictAck if verdict else HeartbeatAck
        ctx.send(to, ack(te=self.te, generation=self.generation, seq=seq, ok=ok, reason=reason, steps=steps,
                         diagnosis=diagnosis, lease_until_s=lease))  # fmt: skip


def dropped(st: HbState) -> list[int]:
    return st.dropped if isinstance(st, HbDroppingState) else []


def lease_key(te: str, generation: int) -> str:
    """What a device's lease names: the TE's generation (`te#generation`); a killed pod voids
    every lease of its TE by the prefix `te#`."""
    return f"{te}#{generation}"
