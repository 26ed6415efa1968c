"""The autoscaler (issue 34 §5): an actor that, once an interval, builds a view of the TE groups
(membership pushed by the cluster manager, open tasks sampled from every member's DP masters,
the requests the gateway saw arrive and answered), asks the selected policies
(autoscaler_policy.py, pure) what to do, records each decision (`AutoscaleDecided`) and — unless
advisory — has the cluster manager carry it out (`ScaleGroup`, `FlipTe`). Spawned only when a
config's `[autoscale]` is enabled (cluster/control.py): without it no log changes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.flowserve.master.messages import DpStatus, DpStatusQuery
from deepserve.actors.je.messages import TeGroupMembership
from deepserve.actors.workload.messages import RequestDone
from deepserve.core import Actor, Context, Event, Message

from . import autoscaler_policy as AP
from .autoscaler_config import Autoscale
from .autoscaler_messages import (
    AnswerSeen,
    ArrivalSeen,
    AutoscaleDecided,
    AutoscaleTick,
    FlipTe,
    LoadSampled,
    MembersSeen,
    RequestSeen,
    WindowRolled,
)
from .messages import ScaleGroup

TICK = "autoscale"


class AutoscalerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    autoscale: Autoscale = msgspec.field(default_factory=Autoscale)
    manager: str = "cluster"
    initial: dict[str, int] = {}  # group -> initial size
    slots: dict[str, int] = {}  # group -> its TE slots (the most it can hold)
    dp_groups: dict[str, int] = {}  # group -> DP groups per TE (whose masters are sampled)
    profiles: dict[str, AP.Profile] = {}  # model -> profile (pd_ratio from profiling, role_switch)
    slo_ttft_ms: float = 2000.0
    slo_tpot_ms: float = 100.0


class GroupObs(msgspec.Struct, kw_only=True):
    model: str
    role: str
    target: int
    tes: list[str] = []


class AsState(msgspec.Struct, kw_only=True):
    groups: dict[str, GroupObs] = {}
    loads: dict[str, dict[str, AP.TeLoad]] = {}  # te -> str(dp) -> sample
    window: dict[str, AP.Window] = {}
    previous: dict[str, AP.Window] = {}  # model -> its last complete window with requests
    reference: dict[str, AP.Window] = {}  # model -> the window P/D ratio changes are judged against
    window_start_s: float = 0.0
    inflight: dict[str, str] = {}  # request id -> model
    last_active_s: dict[str, float] = {}
    last_out_s: dict[str, float] = {}
    last_change_s: dict[str, float] = {}
    last_flip_s: dict[str, float] = {}
    pools: dict[str, tuple[str, float]] = {}  # te -> (transition pool, since)
    decisions: int = 0
    scale_outs: int = 0
    scale_ins: int = 0
    flips: int = 0
    last_decision: str = ""  # the last one, for `deepserve status`


def _role_of(group: str) -> tuple[str, str]:
    model, _, role = group.rpartition("/")
    return model, role


def evolve(s: AsState, e: Event, cfg: AutoscalerConfig) -> AsState:  # noqa: C901 (one branch an event)
    t = type(e)
    if t is LoadSampled:
        s.loads.setdefault(e.te, {})[str(e.dp)] = AP.TeLoad(e.waiting, e.running, e.prefill_tokens_waiting)  # type: ignore[attr-defined]
    elif t is ArrivalSeen:
        s.inflight[e.request_id] = e.model  # type: ignore[attr-defined]
        s.last_active_s[e.model] = e.at_s  # type: ignore[attr-defined]
    elif t is AnswerSeen:
        model = s.inflight.pop(e.request_id, "")  # type: ignore[attr-defined]
        s.last_active_s[model] = e.at_s  # type: ignore[attr-defined]
        w = s.window.setdefault(model, AP.Window())
        w.requests += 1
        w.violated += not e.attained  # type: ignore[attr-defined]
        w.ttft_ms_sum += e.ttft_ms  # type: ignore[attr-defined]
        w.e2e_ms_sum += e.e2e_ms  # type: ignore[attr-defined]
    elif t is MembersSeen:
        g = s.groups.setdefault(e.group, GroupObs(model=e.model, role=e.role, target=len(e.tes)))  # type: ignore[attr-defined]
        g.tes = list(e.tes)  # type: ignore[attr-defined]
    elif t is WindowRolled:
        for model, w in s.window.items():  # an empty window changes nothing
            if w.requests:
                s.previous[model] = w
                s.reference.setdefault(model, w)
        s.window, s.window_start_s = {}, e.at_s  # type: ignore[attr-defined]
        for te, (_, since) in list(s.pools.items()):
            if e.at_s - since >= cfg.autoscale.settle_s:  # type: ignore[attr-defined]
                del s.pools[te]
    elif t is AutoscaleDecided:
        _decided(s, e)  # type: ignore[arg-type]
    else:
        raise ValueError(f"autoscaler: unknown event {t.__name__}")
    return s


def _decided(s: AsState, e: AutoscaleDecided) -> None:
    s.decisions += 1
    what = f"{e.group} to {e.size}" if e.kind == "scale" else f"{e.te} {e.src} -> {e.group}"
    s.last_decision = f"{e.at_s:.1f}s {e.policy}: {what}{' (advice)' if e.advisory else ''}: {e.reason}"
    if e.kind == "scale":
        g = s.groups.get(e.group)
        before = g.target if g is not None else 0
        if e.size > before:
            s.last_out_s[e.group] = e.at_s
        s.last_change_s[e.group] = e.at_s
        if not e.advisory:
            s.scale_outs += e.size > before
            s.scale_ins += e.size < before
            if g is not None:
                g.target = e.size
        return
    model, _ = _role_of(e.group)
    s.last_flip_s[model] = e.at_s
    s.reference.pop(model, None)  # judged afresh from the next window
    if e.advisory:
        return
    s.flips += 1
    s.pools[e.te] = ("D->P" if e.group.endswith("/prefill") else "P->D", e.at_s)
    for name, delta in ((e.src, -1), (e.group, 1)):
        if name in s.groups:
            s.groups[name].target += delta


class Autoscaler(Actor[AsState]):
    snapshot_every = 4096

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.cfg = msgspec.convert(config or {}, AutoscalerConfig)

    def initial_state(self) -> AsState:
        groups = {g: GroupObs(model=_role_of(g)[0], role=_role_of(g)[1], target=n) for g, n in self.cfg.initial.items()}
        return AsState(groups=groups)

    def evolve(self, state: AsState, event: Event) -> AsState:
        return evolve(state, event, self.cfg)

    def on_start(self, ctx: Context) -> None:
        ctx.after(self.cfg.autoscale.interval_s, AutoscaleTick(), key=TICK)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, AutoscaleTick):
            self._tick(ctx)
        elif isinstance(msg, DpStatus) and msg.req_id.startswith("as:"):
            te, _, dp = msg.req_id[3:].rpartition(":")
            ld = msg.load
            ctx.record(LoadSampled(te=te, dp=int(dp), waiting=ld.waiting, running=ld.running,
                                   prefill_tokens_waiting=ld.prefill_tokens_waiting))  # fmt: skip
        elif isinstance(msg, RequestSeen):
            ctx.record(ArrivalSeen(request_id=msg.request_id, model=msg.model, at_s=ctx.now()))
        elif isinstance(msg, RequestDone):
            self._answered(ctx, msg)
        elif isinstance(msg, TeGroupMembership):
            ctx.record(MembersSeen(group=f"{msg.model}/{msg.role}", model=msg.model, role=msg.role, tes=msg.tes))

    def _answered(self, ctx: Context, m: RequestDone) -> None:
        if m.request_id not in self.state.inflight:
            return
        e2e_ms = (m.finish_s - m.arrival_s) * 1e3
        ttft_ms = (m.first_token_s - m.arrival_s) * 1e3 if m.first_token_s is not None else e2e_ms
        ok = m.status == "completed" and m.first_token_s is not None and ttft_ms <= self.cfg.slo_ttft_ms
        if ok and m.output_tokens > 1:
            ok = (m.finish_s - m.first_token_s) * 1e3 / (m.output_tokens - 1) <= self.cfg.slo_tpot_ms  # type: ignore[operator]
        ctx.record(AnswerSeen(request_id=m.request_id, ttft_ms=ttft_ms, e2e_ms=e2e_ms, attained=ok, at_s=ctx.now()))

    def _tick(self, ctx: Context) -> None:
        cfg, now = self.cfg.autoscale, ctx.now()
        if now - self.state.window_start_s >= cfg.window_s:
            ctx.record(WindowRolled(at_s=now))
        for d in AP.decide(cfg, self.view(now)):
            self._apply(ctx, d)
        for name, g in sorted(self.state.groups.items()):
            for te in g.tes:
                for i in range(self.cfg.dp_groups.get(name, 1)):
                    ctx.send(f"{te}/dp/{i}", DpStatusQuery(req_id=f"as:{te}:{i}"))
        ctx.after(cfg.interval_s, AutoscaleTick(), key=TICK)

    def _apply(self, ctx: Context, d: AP.Decision) -> None:
        advisory = self.cfg.autoscale.advisory
        if isinstance(d, AP.ScaleTo):
            ctx.record(AutoscaleDecided(policy=d.policy, kind="scale", group=d.group, size=d.size, te="", src="",
                                        reason=d.reason, advisory=advisory, at_s=ctx.now()))  # fmt: skip
            if not advisory:
                ctx.send(self.cfg.manager, ScaleGroup(group=d.group, size=d.size))
            return
        ctx.record(AutoscaleDecided(policy=d.policy, kind="flip", group=d.dst, size=0, te=d.te, src=d.src,
                                    reason=d.reason, advisory=advisory, at_s=ctx.now()))  # fmt: skip
        if not advisory:
            ctx.send(self.cfg.manager, FlipTe(te=d.te, src=d.src, dst=d.dst, reason=d.reason))

    def view(self, now: float) -> AP.View:
        s = self.state
        loads = {te: AP.TeLoad(sum(x.waiting for x in dps.values()), sum(x.running for x in dps.values()),
                               sum(x.prefill_tokens_waiting for x in dps.values()))
                 for te, dps in s.loads.items()}  # fmt: skip
        groups = {name: AP.GroupView(group=name, model=g.model, role=g.role, tes=tuple(g.tes), target=g.target,
                                     slots=self.cfg.slots.get(name, len(g.tes)))
                  for name, g in s.groups.items()}  # fmt: skip
        inflight: dict[str, int] = {}
        for model in s.inflight.values():
            inflight[model] = inflight.get(model, 0) + 1
        return AP.View(now=now, groups=groups, loads=loads, window=s.window, previous=s.previous, inflight=inflight,
                       reference=s.reference,
                       last_active_s=s.last_active_s, last_out_s=s.last_out_s, last_change_s=s.last_change_s,
                       last_flip_s=s.last_flip_s, pools=s.pools, slo_ttft_ms=self.cfg.slo_ttft_ms,
                       slo_tpot_ms=self.cfg.slo_tpot_ms, profiles=self.cfg.profiles)  # fmt: skip
