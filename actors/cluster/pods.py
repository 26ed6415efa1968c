"""The in-process pod launcher (the pod port's single-process implementation, at `pods`): a
"pod" is the set of a TE's actors in this driver, so launching, stopping and killing are spawns
and stops. Processes mode implements the same port with one OS process per TE (daemon/procs).

Scaler-Pre (pod start) takes `pod_start_s` of this launcher's config — an assumption: the papers
give no figure in their text (DeepServe Fig. 9 ranks TE-Pre-Load above it). A new pod
re-initialises its NPUs (`NpuReset`): a hung or crashed device of a failed predecessor is
healthy and empty again, as after a container restart. `resident` TEs (the initial deployment)
start at once, without a reset.
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

MAX_PODS = 100_000  # a limit on everything


class PodsConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pod_start_s: float = 1.0  # Scaler-Pre (assumption, see the module docstring)
    te_preload_s: float = 2.0  # TE-Pre-Load (assumption: Fig. 9 names it the largest step)

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
        return PodsState()

    def evolve(self, s: PodsState, e: Event) -> PodsState:
        if isinstance(e, PodStarting):
            s.pods[e.launch.pod_id] = Pod(launch=e.launch, reply_to=e.reply_to, started_s=e.at_s)
            s.launched += 1
        elif isinstance(e, PodUp):
            s.pods[e.pod_id].up = True
        elif isinstance(e, PodEnded):
            s.pods.pop(e.pod_id, None)
            s.killed += e.killed
            s.stopped += not e.killed
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        st = self.state
        if isinstance(msg, LaunchPod):
            self._launch(ctx, msg)
        elif isinstance(msg, PodStartDone) and msg.pod_id in st.pods:
            self._up(ctx, msg.pod_id)
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
        ctx.after(self.cfg.pod_start_s, PodStartDone(pod_id=m.pod_id), key=f"start/{m.pod_id}")

    def _up(self, ctx: Context, pid: str) -> None:
        pod = self.state.pods[pid]
        m = pod.launch
        ctx.record(PodUp(pod_id=pid))
        spec = BootSpec(pod_id=pid, generation=m.generation, slot=m.slot, source=m.source, manager=m.manager,
                        te_preload_s=0.0 if m.source == "resident" else self.cfg.te_preload_s,
                        heartbeat_timeout_s=m.heartbeat_timeout_s)  # fmt: skip
        ctx.spawn(f"{m.te}/boot", TeBoot, spec=msgspec.to_builtins(spec))
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
