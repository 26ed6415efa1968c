"""The in-process pod launcher (the pod port's single-process implementation, at `pods`): a
"pod" is the set of a TE's actors in this driver, so launching, stopping and killing are spawns
and stops. Processes mode implements the same port with one OS process per TE (daemon/procs).

Scaler-Pre (pod start) takes `pod_start_s` of this launcher's config — an assumption: the papers
give no figure in their text (DeepServe Fig. 9 ranks TE-Pre-Load above it). A new pod
re-initialises its NPUs (`NpuReset`): a hung or crashed device of a failed predecessor is
healthy and empty again, as after a container restart. `resident` TEs (the initial deployment)
start at once, without a reset.

With `scaling` (the config's `[scaling]`, prewarm.py) the launcher also keeps the pools of
pre-warmed pods and TEs (it is the infrastructure layer DeepServe §6.1 names): each launch takes
what it can (`BootPlanned`: Scaler-Pre from the pod pool or created, TE-Pre-Load pre-warmed or
cold), the pools refill after their cold cost (`PoolRefilled`), and the bootstrap gets the plan.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.ports.faults import NpuReset
from deepserve.actors.ports.npu import NpuVoidLeases
from deepserve.actors.ports.pod import (
    BootSpec,
    KillPod,
    LaunchPod,
    PodExited,
    PodLaunched,
    PodStopped,
    StopPod,
    te_actor_addrs,
)
from deepserve.core import Actor, Context, Event, Message

from .boot import TeBoot
from .messages import PoolsQuery, PoolsStatus
from .prewarm import BootPlan, Pools, Scaling, initial_pools, plan_boot, refill_target

MAX_PODS = 100_000  # a limit on everything


class PodsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pod_start_s: float = 1.0  # Scaler-Pre (assumption, see the module docstring)
    te_preload_s: float = 2.0  # TE-Pre-Load (assumption: Fig. 9 names it the largest step)
    scaling: Scaling | None = None  # [scaling] on: the fast-scaling pipeline (prewarm.py)
    servers: tuple[int, ...] = ()  # servers holding TE slots (a pool of pre-warmed executors each)
    forker: str = ""  # the NPU-fork coordinator (fork.py), "" when NPU-fork is off

    def __post_init__(self) -> None:
        if self.pod_start_s < 0 or self.te_preload_s < 0:
            raise ValueError("pods: pod_start_s and te_preload_s must be >= 0")


class Pod(msgspec.Struct, kw_only=True):
    launch: LaunchPod
    reply_to: str
    started_s: float
    up: bool = False


class PodsState(msgspec.Struct, kw_only=True):
    pods: dict[str, Pod] = {}  # pod id -> live pod (starting or up)
    launched: int = 0
    stopped: int = 0
    killed: int = 0


class ScalingPodsState(PodsState, kw_only=True):
    """The launcher's state with `[scaling]` on: its pools and each starting pod's plan."""

    pools: Pools = msgspec.field(default_factory=Pools)
    plans: dict[str, BootPlan] = {}  # pod id -> its plan, until the pod is up


class PoolsSet(Event, frozen=True, kw_only=True):
    pools: Pools


class BootPlanned(Event, frozen=True, kw_only=True):
    pod_id: str
    server: int
    executors: int
    masters: int
    plan: BootPlan
    at_s: float


class PoolRefilled(Event, frozen=True, kw_only=True):
    kind: str  # pod, master, executor
    server: int  # executors: whose pool; else -1
    size: int  # the pool's size now


class PoolRefill(Message, frozen=True, kw_only=True):
    """The launcher's timer: a pre-warmed unit of `kind` finished its cold start."""

    kind: str
    server: int = -1


class PodStarting(Event, frozen=True, kw_only=True):
    launch: LaunchPod
    reply_to: str
    at_s: float


class PodUp(Event, frozen=True, kw_only=True):
    pod_id: str


class PodEnded(Event, frozen=True, kw_only=True):
    pod_id: str
    killed: bool
    reason: str


class PodStartDone(Message, frozen=True, kw_only=True):
    """The launcher's timer: the pod's environment is up."""

    pod_id: str


class InProcessPods(Actor[PodsState]):
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.cfg = msgspec.convert(config or {}, PodsConfig)

    def initial_state(self) -> PodsState:
        return PodsState() if self.cfg.scaling is None else ScalingPodsState()

    def on_start(self, ctx: Context) -> None:
        if self.cfg.scaling is not None:
            ctx.record(PoolsSet(pools=initial_pools(self.cfg.scaling, self.cfg.servers)))

    def pools_status(self, req_id: str = "") -> PoolsStatus:
        """What the launcher holds pre-warmed now: `PoolsQuery`'s answer, and (read off the live
        actor, no recorded input) the daemon's status."""
        st, cfg = self.state, self.cfg.scaling
        if isinstance(st, ScalingPodsState) and cfg is not None:
            p = st.pools
            return PoolsStatus(req_id=req_id, enabled=True, pods=p.pods, masters=p.masters,
                               executors=dict(p.executors), policy=cfg.pool_policy)  # fmt: skip
        return PoolsStatus(req_id=req_id, enabled=False)

    def evolve(self, s: PodsState, e: Event) -> PodsState:
        if isinstance(s, ScalingPodsState) and isinstance(e, PoolsSet | BootPlanned | PoolRefilled):
            evolve_pools(s, e)
        elif isinstance(e, PodStarting):
            s.pods[e.launch.pod_id] = Pod(launch=e.launch, reply_to=e.reply_to, started_s=e.at_s)
            s.launched += 1
        elif isinstance(e, PodUp):
            s.pods[e.pod_id].up = True
        elif isinstance(e, PodEnded):
            s.pods.pop(e.pod_id, None)
            if isinstance(s, ScalingPodsState):
                s.plans.pop(e.pod_id, None)
            s.killed += e.killed
            s.stopped += not e.killed
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        st = self.state
        if isinstance(msg, LaunchPod):
            self._launch(ctx, msg)
        elif isinstance(msg, PodStartDone) and msg.pod_id in st.pods:
            self._up(ctx, msg.pod_id)
        elif isinstance(msg, PoolRefill):
            self._refill(ctx, msg)
        elif isinstance(msg, PoolsQuery):
            ctx.reply(self.pools_status(msg.req_id))
        elif isinstance(msg, StopPod):
            if msg.pod_id in st.pods:
                self._end(ctx, msg.pod_id, False, msg.reason)
            ctx.send(msg.reply_to or ctx.sender, PodStopped(pod_id=msg.pod_id, te=msg.te))
        elif isinstance(msg, KillPod):
            for pid in [p for p, pod in st.pods.items() if pod.launch.te == msg.te]:
                launch, reply_to = st.pods[pid].launch, st.pods[pid].reply_to
                self._end(ctx, pid, True, msg.reason)
                for npu in launch.slot.npus:  # its devices' heartbeat leases (heartbeat.py) are off
                    ctx.send(npu, NpuVoidLeases(key_prefix=f"{launch.te}#", reason=f"pod {pid} killed"))
                if msg.exited:  # a process kill: the launcher reaps it and says so
                    ctx.send(reply_to, PodExited(pod_id=pid, te=launch.te, generation=launch.generation,
                                                 reason=msg.reason))  # fmt: skip

    def _launch(self, ctx: Context, m: LaunchPod) -> None:
        st = self.state
        busy = [p for p, pod in st.pods.items() if pod.launch.te == m.te]
        for pid in busy:  # a TE has one pod: a leftover predecessor goes first
            self._end(ctx, pid, False, f"replaced by {m.pod_id}")
        if len(st.pods) >= MAX_PODS:
            return
        ctx.record(PodStarting(launch=m, reply_to=m.reply_to or ctx.sender, at_s=ctx.now()))
        if m.source == "resident":
            self._up(ctx, m.pod_id)
            return
        for npu in m.slot.npus:
            ctx.send(npu, NpuReset())
        start_s = self.cfg.pod_start_s
        if self.cfg.scaling is not None:
            start_s = self._plan(ctx, m).scaler_pre_s
        ctx.after(start_s, PodStartDone(pod_id=m.pod_id), key=f"start/{m.pod_id}")

    def _plan(self, ctx: Context, m: LaunchPod) -> BootPlan:
        """Scaler-Pre and TE-Pre-Load for this launch, from the pools; what it took refills later."""
        cfg, st = self.cfg.scaling, self.state
        assert cfg is not None and isinstance(st, ScalingPodsState)
        executors, masters = m.slot.tp * m.slot.dp_groups, m.slot.dp_groups
        plan = plan_boot(cfg, st.pools, m.slot.server, executors, masters, self.cfg.pod_start_s,
                         queued=_importing(st, m.slot.server, ctx.now()) if cfg.import_serial else 0)
        ctx.record(BootPlanned(pod_id=m.pod_id, server=m.slot.server, executors=executors, masters=masters,
                               plan=plan, at_s=ctx.now()))  # fmt: skip
        if plan.pod_from_pool:
            ctx.after(self.cfg.pod_start_s, PoolRefill(kind="pod"), key=f"refill/{m.pod_id}/pod")
        if plan.te_prewarmed:
            ctx.after(cfg.cold_pre_load_s(), PoolRefill(kind="master"), key=f"refill/{m.pod_id}/master")
            ctx.after(cfg.cold_pre_load_s(), PoolRefill(kind="executor", server=m.slot.server),
                      key=f"refill/{m.pod_id}/executor")  # fmt: skip
        return plan

    def _refill(self, ctx: Context, msg: PoolRefill) -> None:
        st, cfg = self.state, self.cfg.scaling
        if not isinstance(st, ScalingPodsState) or cfg is None:
            return
        p = st.pools
        have = {"pod": p.pods, "master": p.masters}.get(msg.kind, p.executors.get(str(msg.server), 0))
        target = refill_target(cfg, msg.kind, ctx.now(), p.demand)
        if have < target:
            ctx.record(PoolRefilled(kind=msg.kind, server=msg.server, size=target))

    def _up(self, ctx: Context, pid: str) -> None:
        pod = self.state.pods[pid]
        m = pod.launch
        ctx.record(PodUp(pod_id=pid))
        st = self.state
        plan = st.plans.get(pid) if isinstance(st, ScalingPodsState) else None
        preload_s = self.cfg.te_preload_s if plan is None else plan.te_pre_load_s
        spec = BootSpec(pod_id=pid, generation=m.generation, slot=m.slot, source=m.source, manager=m.manager,
                        te_preload_s=0.0 if m.source == "resident" else preload_s,
                        heartbeat_timeout_s=m.heartbeat_timeout_s)  # fmt: skip
        if plan is None or self.cfg.scaling is None:
            ctx.spawn(f"{m.te}/boot", TeBoot, spec=msgspec.to_builtins(spec))
        else:
            scale = {"scaler_pre_s": plan.scaler_pre_s, "pre_load_detail": plan.pre_load_detail,
                     "scaler_pre_detail": "pre-warmed pod" if plan.pod_from_pool else "pod created",
                     "forker": self.cfg.forker, "warmup": self.cfg.scaling.warmup}  # fmt: skip
            ctx.spawn(f"{m.te}/boot", TeBoot, spec=msgspec.to_builtins(spec), scale=scale)
        ctx.send(pod.reply_to, PodLaunched(pod_id=pid, te=m.te, generation=m.generation, endpoint="",
                                           duration_s=ctx.now() - pod.started_s))  # fmt: skip

    def _end(self, ctx: Context, pid: str, killed: bool, reason: str) -> None:
        pod = self.state.pods[pid]
        ctx.cancel(f"start/{pid}")
        ctx.record(PodEnded(pod_id=pid, killed=killed, reason=reason))
        if not pod.up:
            return
        hb = pod.launch.heartbeat_timeout_s > 0
        for addr in te_actor_addrs(pod.launch.slot):
            if hb or not addr.endswith("/hb"):
                ctx.stop(addr)


def evolve_pools(s: Any, e: Event) -> None:
    """The pools' part of a launcher's state (`pools`, `plans`): this one's and processes mode's."""
    p = s.pools
    if isinstance(e, PoolsSet):
        s.pools = msgspec.structs.replace(e.pools, executors=dict(e.pools.executors), demand=list(e.pools.demand))
    elif isinstance(e, BootPlanned):
        s.plans[e.pod_id] = e.plan
        if e.plan.pod_from_pool:
            p.pods -= 1
        if e.plan.te_prewarmed:
            p.masters -= e.masters
            p.executors[str(e.server)] = p.executors.get(str(e.server), 0) - e.executors
        # the demand, met from a pool or not: what the predictor sizes the next refill by
        p.demand += [(e.at_s, "pod"), *((e.at_s, "master") for _ in range(e.masters))]
        if len(p.demand) > 4096:  # a limit on everything: the predictor's window is the recent past
            del p.demand[: len(p.demand) - 4096]
    elif isinstance(e, PoolRefilled):
        if e.kind == "pod":
            p.pods = e.size
        elif e.kind == "master":
            p.masters = e.size
        else:
            p.executors[str(e.server)] = e.size


def _importing(st: ScalingPodsState, server: int, now_s: float) -> int:
    """Cold starts on `server` still in their Scaler-Pre or TE-Pre-Load (`import_serial`)."""
    n = 0
    for pid, plan in st.plans.items():
        pod = st.pods.get(pid)
        if (pod is not None and not plan.te_prewarmed and pod.launch.slot.server == server
                and pod.started_s + plan.scaler_pre_s + plan.te_pre_load_s > now_s):  # fmt: skip
            n += 1
    return n
