"""The processes-mode pod launcher with `[scaling]` on (DeepServe §6.1 in `up --processes`): the
same pools as the in-process launcher (actors/cluster/pods.py, prewarm.py), where the pool of
pre-warmed TEs is made of real OS processes.

- A pre-warmed TE is a TE process (`te_host --warm`) that has done its Python start-up (every
  import a TE needs) and waits, model-agnostic, with no slot: the supervisor starts them
  (`WarmProcesses`) and says when each is ready (`ProcessWarm`, its Python start measured). The
  pool's `masters` count is these processes (one process holds a TE's DP masters); its pods (the
  infrastructure layer's, Scaler-Pre) and each server's executors (NPU and HCCL initialised)
  stay modeled, refilled after their modeled cold cost as in process mode.
- A launch plans Scaler-Pre and TE-Pre-Load (`plan_boot`, recorded `BootPlanned`); after
  Scaler-Pre it asks for a process: the claimed pre-warmed one (`SpawnProcess.warm_pid`, recorded
  `WarmClaimed`; the pool is topped up at once) or a cold one. When the process is up, the
  manager gets a `python_start` step — measured, real: spawn → ready for a cold process, claim →
  ready for a pre-warmed one — and the bootstrap gets the plan (`BootPod.scale`): TE-Pre-Load
  models only NPU and HCCL init (Python was real), TE-Load forks from a running TE over the
  emulated fabric when NPU-fork is on, and the dummy-request warm-up runs in the new process
  before it registers.
Without `[scaling]` the runtime spawns the plain `ProcessPods`: old logs replay unchanged.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.cluster.messages import PoolsQuery, PoolsStatus, TeBootStep
from deepserve.actors.cluster.pods import (
    BootPlanned,
    PoolRefill,
    PoolRefilled,
    PoolsSet,
    evolve_pools,
)
from deepserve.actors.cluster.prewarm import (
    BootPlan,
    Pools,
    Scaling,
    initial_pools,
    plan_boot,
    refill_target,
)
from deepserve.actors.ports.pod import IMPLEMENTED_SOURCES, LaunchPod, PodLaunched
from deepserve.core import Context, Event, Message

from .launcher import (
    MAX_PODS,
    ProcessPods,
    ProcPodGone,
    ProcPodsConfig,
    ProcPodsState,
    ProcPodStarting,
    ProcPodUp,
    evolve_pods,
)
from .messages import (
    SUPERVISOR,
    BootPod,
    PeerRoutes,
    ProcessUp,
    ProcessWarm,
    ProcessWarmLost,
    SpawnProcess,
    WarmProcesses,
)

MAX_WARMING = 64  # a limit on everything: pre-warmed processes asked for and not ready yet


class ScalingProcPodsConfig(ProcPodsConfig, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pod_start_s: float = 1.0  # Scaler-Pre when no pre-warmed pod is left (the in-process launcher's)
    scaling: Scaling = msgspec.field(default_factory=Scaling)
    servers: tuple[int, ...] = ()  # servers holding TE slots (spares included): executor pools
    forker: str = ""  # the NPU-fork coordinator, "" when NPU-fork is off


class WarmProcess(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    python_s: float  # measured: its spawn to ready


class ScalingProcPodsState(ProcPodsState, kw_only=True):
    pools: Pools = msgspec.field(default_factory=Pools)
    plans: dict[str, BootPlan] = {}  # pod id -> its plan, until its process is up
    warm: list[WarmProcess] = []  # pre-warmed processes, oldest first
    warming: int = 0  # asked of the supervisor, not ready yet
    claimed: dict[str, WarmProcess] = {}  # pod id -> the pre-warmed process it claimed
    asked: list[str] = []  # pods whose process was asked of the supervisor (Scaler-Pre is over)


class WarmAsked(Event, frozen=True, kw_only=True):
    count: int


class WarmReady(Event, frozen=True, kw_only=True):
    pid: int
    python_s: float


class WarmLost(Event, frozen=True, kw_only=True):
    pid: int
    reason: str


class WarmClaimed(Event, frozen=True, kw_only=True):
    pod_id: str
    pid: int


class WarmReturned(Event, frozen=True, kw_only=True):
    """A pod stopped during its Scaler-Pre: the process it claimed goes back to the pool."""

    pod_id: str


class SpawnAsked(Event, frozen=True, kw_only=True):
    pod_id: str


class PodStartDue(Message, frozen=True, kw_only=True):
    """The launcher's timer: Scaler-Pre is over, the pod's process is asked for."""

    pod_id: str


def evolve_scaling(s: ScalingProcPodsState, e: Event) -> ScalingProcPodsState:
    if isinstance(e, PoolsSet | BootPlanned | PoolRefilled):
        evolve_pools(s, e)
        if isinstance(e, BootPlanned):
            return s  # its master is a process: `WarmClaimed` takes it
    elif isinstance(e, WarmAsked):
        s.warming += e.count
    elif isinstance(e, WarmReady):
        s.warming = max(0, s.warming - 1)
        s.warm.append(WarmProcess(pid=e.pid, python_s=e.python_s))
    elif isinstance(e, WarmLost):
        before = len(s.warm)
        s.warm = [w for w in s.warm if w.pid != e.pid]
        if len(s.warm) == before:  # it never got ready
            s.warming = max(0, s.warming - 1)
    elif isinstance(e, WarmClaimed):
        s.claimed[e.pod_id] = next(w for w in s.warm if w.pid == e.pid)
        s.warm = [w for w in s.warm if w.pid != e.pid]
    elif isinstance(e, WarmReturned):
        s.warm.append(s.claimed.pop(e.pod_id))
    elif isinstance(e, SpawnAsked):
        s.asked.append(e.pod_id)
    else:
        evolve_pods(s, e)
        if isinstance(e, ProcPodUp | ProcPodGone):
            s.plans.pop(e.pod_id, None)
            s.claimed.pop(e.pod_id, None)
            if e.pod_id in s.asked:
                s.asked.remove(e.pod_id)
        return s
    s.pools.masters = len(s.warm)
    return s


class ScalingProcessPods(ProcessPods):
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.scfg = msgspec.convert(config or {}, ScalingProcPodsConfig)
        self.cfg = self.scfg  # the base launcher's settings (te_preload_s)

    def initial_state(self) -> ScalingProcPodsState:
        return ScalingProcPodsState()

    def evolve(self, s: ProcPodsState, e: Event) -> ProcPodsState:
        assert isinstance(s, ScalingProcPodsState)
        return evolve_scaling(s, e)

    def on_start(self, ctx: Context) -> None:
        pools = initial_pools(self.scfg.scaling, self.scfg.servers)
        pools.masters = 0  # the processes come as they get ready
        ctx.record(PoolsSet(pools=pools))
        self._top_up(ctx)

    def pools_status(self, req_id: str = "") -> PoolsStatus:
        p = self.st.pools
        return PoolsStatus(req_id=req_id, enabled=True, pods=p.pods, masters=p.masters,
                           executors=dict(p.executors), policy=self.scfg.scaling.pool_policy)  # fmt: skip

    @property
    def st(self) -> ScalingProcPodsState:
        s = self.state
        assert isinstance(s, ScalingProcPodsState)
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        st = self.st
        if isinstance(msg, ProcessWarm):
            ctx.record(WarmReady(pid=msg.pid, python_s=msg.python_s))
        elif isinstance(msg, ProcessWarmLost):
            was_ready = any(w.pid == msg.pid for w in st.warm)
            ctx.record(WarmLost(pid=msg.pid, reason=msg.reason))
            if was_ready:  # one that never got ready is not retried now (no crash loop): the next claim asks
                self._top_up(ctx)
        elif isinstance(msg, PodStartDue) and msg.pod_id in st.pods and msg.pod_id not in st.asked:
            m = st.pods[msg.pod_id].launch
            claimed = st.claimed.get(m.pod_id)
            ctx.record(SpawnAsked(pod_id=m.pod_id))
            ctx.send(SUPERVISOR, SpawnProcess(pod_id=m.pod_id, spec=self._spec(m),
                                              warm_pid=claimed.pid if claimed else 0))  # fmt: skip
        elif isinstance(msg, PoolRefill):
            self._refill(ctx, msg)
        elif isinstance(msg, PoolsQuery):
            ctx.reply(self.pools_status(msg.req_id))
        else:
            super().handle(ctx, msg)

    def _launch(self, ctx: Context, m: LaunchPod) -> None:
        if m.source == "resident" or m.source not in IMPLEMENTED_SOURCES or len(self.st.pods) >= MAX_PODS:
            super()._launch(ctx, m)  # the initial deployment (and refusals) as without [scaling]
            return
        reply_to = m.reply_to or ctx.sender
        for pid, pod in list(self.st.pods.items()):  # a TE has one pod: a leftover goes first
            if pod.launch.te == m.te and pod.phase != "stopping":
                self._signal(ctx, pid, False, f"replaced by {m.pod_id}")
        ctx.record(ProcPodStarting(launch=m, reply_to=reply_to, at_s=ctx.now()))
        cfg, st = self.scfg.scaling, self.st
        executors = m.slot.tp * m.slot.dp_groups
        plan = plan_boot(cfg, st.pools, m.slot.server, executors, 1, self.scfg.pod_start_s, python_real=True)
        ctx.record(BootPlanned(pod_id=m.pod_id, server=m.slot.server, executors=executors, masters=1, plan=plan,
                               at_s=ctx.now()))  # fmt: skip
        if plan.te_prewarmed:
            ctx.record(WarmClaimed(pod_id=m.pod_id, pid=st.warm[0].pid))
            ctx.after(cfg.npu_init_s + cfg.hccl_init_s, PoolRefill(kind="executor", server=m.slot.server),
                      key=f"refill/{m.pod_id}/executor")  # fmt: skip
            self._top_up(ctx)
        if plan.pod_from_pool:
            ctx.after(self.scfg.pod_start_s, PoolRefill(kind="pod"), key=f"refill/{m.pod_id}/pod")
        ctx.after(plan.scaler_pre_s, PodStartDue(pod_id=m.pod_id), key=f"start/{m.pod_id}")

    def _top_up(self, ctx: Context) -> None:
        """Ask for pre-warmed processes up to the pool's target (fixed, or the demand predicted)."""
        st = self.st
        target = refill_target(self.scfg.scaling, "master", ctx.now(), st.pools.demand)
        n = min(target - len(st.warm) - st.warming, MAX_WARMING - st.warming)
        if n > 0:
            ctx.record(WarmAsked(count=n))
            ctx.send(SUPERVISOR, WarmProcesses(count=n))

    def _refill(self, ctx: Context, msg: PoolRefill) -> None:
        p = self.st.pools
        if msg.kind not in ("pod", "executor"):
            return
        have = p.pods if msg.kind == "pod" else p.executors.get(str(msg.server), 0)
        target = refill_target(self.scfg.scaling, msg.kind, ctx.now(), p.demand)
        if have < target:
            ctx.record(PoolRefilled(kind=msg.kind, server=msg.server, size=target))

    def _up(self, ctx: Context, msg: ProcessUp) -> None:
        st = self.st
        pod = st.pods[msg.pod_id]
        plan = st.plans.get(msg.pod_id)
        if pod.phase != "starting":
            return
        if plan is None:  # a resident TE: as without [scaling]
            super()._up(ctx, msg)
            return
        claimed = st.claimed.get(msg.pod_id)
        spec = self._spec(pod.launch)
        ctx.record(ProcPodUp(pod_id=msg.pod_id, pid=msg.pid, endpoint=msg.endpoint, log=msg.log))
        m = pod.launch
        ctx.send(pod.reply_to, PodLaunched(pod_id=m.pod_id, te=m.te, generation=m.generation, endpoint=msg.endpoint,
                                           duration_s=ctx.now() - pod.started_s))  # fmt: skip
        if msg.warm_python_s > 0:
            how = f"real: pre-warmed process pid {msg.pid} (its python start {msg.warm_python_s:.3f} s, before)"
        elif claimed:
            how = f"real: cold process pid {msg.pid} (pre-warmed pid {claimed.pid} was gone)"
        else:
            how = f"real: cold process pid {msg.pid}"
        ctx.send(m.manager, TeBootStep(te=m.te, generation=m.generation, pod_id=m.pod_id, step="python_start",
                                       duration_s=msg.start_s, detail=how))  # fmt: skip
        agent = f"{m.te}/pod"
        ctx.send(agent, PeerRoutes(version=st.dir_version, routes=dict(st.directory)))
        scale = {"scaler_pre_s": plan.scaler_pre_s, "pre_load_detail": plan.pre_load_detail,
                 "scaler_pre_detail": "pre-warmed pod" if plan.pod_from_pool else "pod created",
                 "forker": self.scfg.forker, "warmup": self.scfg.scaling.warmup}  # fmt: skip
        ctx.send(agent, BootPod(spec=spec, scale=scale))

    def _spec(self, m: LaunchPod) -> Any:
        spec = super()._spec(m)
        plan = self.st.plans.get(m.pod_id)
        return spec if plan is None else msgspec.structs.replace(spec, te_preload_s=plan.te_pre_load_s)

    def _signal(self, ctx: Context, pid: str, kill: bool, reason: str) -> None:
        st = self.st
        if pid in st.plans and pid not in st.asked:  # still in Scaler-Pre: no process to signal
            ctx.cancel(f"start/{pid}")
            if pid in st.claimed:
                ctx.record(WarmReturned(pod_id=pid))
            self._gone(ctx, pid, 0, f"stopped during Scaler-Pre: {reason}")
            return
        super()._signal(ctx, pid, kill, reason)
