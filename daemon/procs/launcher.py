"""The pod-launcher port in processes mode (`actors/ports/pod.py`): one OS process per pod.

`ProcessPods` (at `pods`, in the main process) decides; the supervisor carries it out and
reports back (`messages.py`). `LaunchPod` → `SpawnProcess`; the supervisor's `ProcessUp`
(the process runs, its transport is bound, the main transport routes the TE's addresses to it)
→ `PodLaunched` to the manager, then `BootPod` to the process's pod agent, which starts the TE's
bootstrap (`TeBoot`: TE-Pre-Load, weights through the host port, the TE shell, `RegisterTe`).
`PodLaunched` leaves first, so the manager knows the pod before the TE can register.

A process that exits is reaped and reported (`ProcessExited`), and nothing here restarts it: a
pod that dies before it came up answers `PodFailed`; one that dies on its own after is reported
to the manager as `PodExited`, which fails the TE at once, booting or registered (the heartbeat
monitor is left the processes that hang without exiting); either way the cluster manager decides
the replacement and launches it through this port. A process the supervisor stopped itself as
the daemon shut down (`ProcessExited.shutdown`) is recorded gone and reported to nobody.

`PodAgent` (at `{te}/pod`, in the TE process) starts the bootstrap and hands the cluster
manager's directory (relayed here as `PeerRoutes`) to its process's transport.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from deepserve.actors.cluster.boot import TeBoot
from deepserve.actors.cluster.messages import DirectoryUpdate
from deepserve.actors.ports.pod import (
    IMPLEMENTED_SOURCES,
    BootSpec,
    KillPod,
    LaunchPod,
    PodExited,
    PodFailed,
    PodLaunched,
    PodStopped,
    StopPod,
)
from deepserve.core import Actor, Context, Event, Message

from .messages import (
    HOST_DIRECTORY,
    SUPERVISOR,
    BootPod,
    PeerRoutes,
    ProcessExited,
    ProcessStartFailed,
    ProcessUp,
    SignalProcess,
    SpawnProcess,
)

MAX_PODS = 4096  # a limit on everything: pods starting, up or stopping at once
PodPhase = Literal["starting", "up", "stopping"]


class ProcPodsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    te_preload_s: float = 2.0  # TE-Pre-Load (assumption, as the in-process launcher's)

    def __post_init__(self) -> None:
        if not 0 <= self.te_preload_s <= 3600:
            raise ValueError(f"pods: te_preload_s must be in [0, 3600], got {self.te_preload_s}")


class ProcPod(msgspec.Struct, kw_only=True):
    launch: LaunchPod
    reply_to: str
    started_s: float
    phase: PodPhase = "starting"
    pid: int = 0
    endpoint: str = ""
    log: str = ""
    killed: bool = False


class ProcPodsState(msgspec.Struct, kw_only=True):
    pods: dict[str, ProcPod] = {}  # pod id -> a pod whose process has not been reaped yet
    directory: dict[str, str] = {}  # the manager's latest published directory
    dir_version: int = 0
    launched: int = 0
    exited: int = 0
    killed: int = 0
    failed: int = 0


class ProcPodStarting(Event, frozen=True, kw_only=True):
    launch: LaunchPod
    reply_to: str
    at_s: float


class ProcPodUp(Event, frozen=True, kw_only=True):
    pod_id: str
    pid: int
    endpoint: str
    log: str


class ProcPodStopping(Event, frozen=True, kw_only=True):
    pod_id: str
    kill: bool
    reason: str


class ProcPodGone(Event, frozen=True, kw_only=True):
    pod_id: str
    returncode: int
    reason: str
    failed: bool  # it never came up


class ProcDirectorySeen(Event, frozen=True, kw_only=True):
    version: int
    routes: dict[str, str]


def evolve_pods(s: ProcPodsState, e: Event) -> ProcPodsState:
    if isinstance(e, ProcPodStarting):
        s.pods[e.launch.pod_id] = ProcPod(launch=e.launch, reply_to=e.reply_to, started_s=e.at_s)
        s.launched += 1
    elif isinstance(e, ProcPodUp):
        p = s.pods[e.pod_id]
        p.phase, p.pid, p.endpoint, p.log = "up", e.pid, e.endpoint, e.log
    elif isinstance(e, ProcPodStopping):
        p = s.pods[e.pod_id]
        p.phase, p.killed = "stopping", p.killed or e.kill
    elif isinstance(e, ProcPodGone):
        p = s.pods.pop(e.pod_id)
        s.exited += 1
        s.killed += p.killed
        s.failed += e.failed
    elif isinstance(e, ProcDirectorySeen):
        s.directory, s.dir_version = dict(e.routes), e.version
    else:
        raise ValueError(f"pods: unknown event {type(e).__name__}")
    return s


class ProcessPods(Actor[ProcPodsState]):
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.cfg = msgspec.convert(config or {}, ProcPodsConfig)

    def initial_state(self) -> ProcPodsState:
        return ProcPodsState()

    def evolve(self, s: ProcPodsState, e: Event) -> ProcPodsState:
        return evolve_pods(s, e)

    def handle(self, ctx: Context, msg: Message) -> None:
        pods = self.state.pods
        if isinstance(msg, LaunchPod):
            self._launch(ctx, msg)
        elif isinstance(msg, ProcessUp) and msg.pod_id in pods:
            self._up(ctx, msg)
        elif isinstance(msg, ProcessStartFailed) and msg.pod_id in pods:
            self._gone(ctx, msg.pod_id, 0, f"the process did not start: {msg.reason}")
        elif isinstance(msg, ProcessExited) and msg.pod_id in pods:
            self._gone(ctx, msg.pod_id, msg.returncode, exit_reason(msg.returncode, msg.pid), msg.shutdown)
        elif isinstance(msg, StopPod):
            if msg.pod_id in pods:
                self._signal(ctx, msg.pod_id, False, msg.reason)
            ctx.send(msg.reply_to or ctx.sender, PodStopped(pod_id=msg.pod_id, te=msg.te))
        elif isinstance(msg, KillPod):
            for pid in [p for p, pod in pods.items() if pod.launch.te == msg.te]:
                self._signal(ctx, pid, True, msg.reason)
        elif isinstance(msg, DirectoryUpdate):
            self._directory(ctx, msg)

    def _launch(self, ctx: Context, m: LaunchPod) -> None:
        reply_to = m.reply_to or ctx.sender
        if m.source not in IMPLEMENTED_SOURCES or len(self.state.pods) >= MAX_PODS:
            why = (f"source {m.source!r} is not implemented yet" if m.source not in IMPLEMENTED_SOURCES
                   else f"{MAX_PODS} pods already")  # fmt: skip
            ctx.send(reply_to, PodFailed(pod_id=m.pod_id, te=m.te, generation=m.generation, reason=why))
            return
        for pid, pod in list(self.state.pods.items()):  # a TE has one pod: a leftover goes first
            if pod.launch.te == m.te and pod.phase != "stopping":
                self._signal(ctx, pid, False, f"replaced by {m.pod_id}")
        ctx.record(ProcPodStarting(launch=m, reply_to=reply_to, at_s=ctx.now()))
        ctx.send(SUPERVISOR, SpawnProcess(pod_id=m.pod_id, spec=self._spec(m)))

    def _up(self, ctx: Context, msg: ProcessUp) -> None:
        pod = self.state.pods[msg.pod_id]
        if pod.phase != "starting":
            return  # told to stop while it started: its exit is reported next
        ctx.record(ProcPodUp(pod_id=msg.pod_id, pid=msg.pid, endpoint=msg.endpoint, log=msg.log))
        m = pod.launch
        ctx.send(pod.reply_to, PodLaunched(pod_id=m.pod_id, te=m.te, generation=m.generation, endpoint=msg.endpoint,
                                           duration_s=ctx.now() - pod.started_s))  # fmt: skip
        st = self.state
        agent = f"{m.te}/pod"
        ctx.send(agent, PeerRoutes(version=st.dir_version, routes=dict(st.directory)))
        ctx.send(agent, BootPod(spec=self._spec(m)))

    def _spec(self, m: LaunchPod) -> BootSpec:
        return BootSpec(pod_id=m.pod_id, generation=m.generation, slot=m.slot, source=m.source, manager=m.manager,
                        te_preload_s=0.0 if m.source == "resident" else self.cfg.te_preload_s,
                        heartbeat_timeout_s=m.heartbeat_timeout_s)  # fmt: skip

    def _signal(self, ctx: Context, pid: str, kill: bool, reason: str) -> None:
        pod = self.state.pods[pid]
        if pod.phase == "stopping" and (pod.killed or not kill):
            return
        ctx.record(ProcPodStopping(pod_id=pid, kill=kill, reason=reason))
        ctx.send(SUPERVISOR, SignalProcess(pod_id=pid, kill=kill, reason=reason))

    def _gone(self, ctx: Context, pid: str, returncode: int, reason: str, shutdown: bool = False) -> None:
        pod = self.state.pods[pid]
        never_up = pod.phase == "starting"
        ctx.record(ProcPodGone(pod_id=pid, returncode=returncode, reason=reason, failed=never_up))
        m = pod.launch
        if shutdown:
            return  # the daemon stopped it on its way out: nothing to fail or replace
        if never_up:  # no heartbeat watches a pod that never came up: say so now
            ctx.send(pod.reply_to, PodFailed(pod_id=pid, te=m.te, generation=m.generation, reason=reason))
        elif pod.phase == "up" or (pod.killed and pod.pid):  # a crash, or `KillPod` (a crash on purpose)
            ctx.send(pod.reply_to, PodExited(pod_id=pid, te=m.te, generation=m.generation, reason=reason))

    def _directory(self, ctx: Context, msg: DirectoryUpdate) -> None:
        if msg.version <= self.state.dir_version:
            return
        ctx.record(ProcDirectorySeen(version=msg.version, routes=dict(msg.routes)))
        routes = PeerRoutes(version=msg.version, routes=dict(msg.routes), removed=msg.removed)
        ctx.send(HOST_DIRECTORY, routes)
        for pod in self.state.pods.values():
            if pod.phase == "up":
                ctx.send(f"{pod.launch.te}/pod", routes)


def exit_reason(returncode: int, pid: int = 0) -> str:
    proc = f"the TE process (pid {pid})" if pid else "the TE process"
    if returncode < 0:
        import signal

        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{proc} was killed by {name}"
    return f"{proc} exited with status {returncode}"


class AgentState(msgspec.Struct, kw_only=True):
    booted: str = ""  # the pod id whose bootstrap was started


class AgentBooted(Event, frozen=True, kw_only=True):
    pod_id: str


class PodAgent(Actor[AgentState]):
    """In a TE process: starts the TE's bootstrap once, relays directory changes to the host."""

    def __init__(self, te: str) -> None:
        self.te = te

    def initial_state(self) -> AgentState:
        return AgentState()

    def evolve(self, s: AgentState, e: Event) -> AgentState:
        if isinstance(e, AgentBooted):
            s.booted = e.pod_id
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, BootPod) and not self.state.booted and msg.spec.slot.te == self.te:
            ctx.record(AgentBooted(pod_id=msg.spec.pod_id))
            if msg.scale is None:
                ctx.spawn(f"{self.te}/boot", TeBoot, spec=msgspec.to_builtins(msg.spec))
            else:
                ctx.spawn(f"{self.te}/boot", TeBoot, spec=msgspec.to_builtins(msg.spec), scale=dict(msg.scale))
        elif isinstance(msg, PeerRoutes):
            ctx.send(HOST_DIRECTORY, msg)
