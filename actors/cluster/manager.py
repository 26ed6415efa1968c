"""The cluster manager (DeepServe §3: "oversees and scales all JEs and TEs"): the TE registry
(state and generation per TE), the directory of addresses → endpoints, the TE groups (model,
role) with their membership pushed to every JE on every change (Table 2, Scaler-Post: proactive
pushing), and creating / replacing TEs through the pod-launcher port with each boot step's
duration recorded (pod start, TE-Pre-Load, SSD → DRAM, DRAM → NPU, registered).

Decisions are pure (`policy.py`); this actor records them and carries them out. Without a pod
launcher (`pods=""`, how `deepserve sim` wires it) it is the stand-in it replaces: TEs register
themselves, `RemoveTe` drops one, membership is pushed.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.flowserve.distflow.probe import KvLinkDiagnosis
from deepserve.actors.flowserve.master.messages import DpStatus, DpStatusQuery
from deepserve.actors.flowserve.messages import CancelOwner, RegisterTe
from deepserve.actors.je.messages import TeGroupMembership
from deepserve.actors.ports.pod import (
    LaunchPod,
    LoadSource,
    PodExited,
    PodFailed,
    PodLaunched,
    StopPod,
    TeSlot,
    pod_id,
)
from deepserve.core import Actor, Context, Event, Message

from . import healthacts as H
from . import kvpaths as K
from . import ladder as L
from . import policy as P
from .autoscaler_messages import FlipTe
from .flip import flip
from .messages import (
    BOOT,
    EXITED,
    BootTimeout,
    ClusterStatus,
    ClusterStatusQuery,
    DirectoryUpdate,
    DrainPoll,
    DrainTe,
    HbDropDp,
    RelaunchTe,
    RemoveTe,
    ScaleGroup,
    TeBootFailed,
    TeBootStep,
    TeFailed,
    UnwatchTe,
    WatchTe,
)
from .state import (
    CmState,
    DirectoryChanged,
    DrainProbed,
    GroupTarget,
    MembershipPushed,
    OwnerCancelled,
    ScaleRefused,
    TeBootBackoff,
    TeDeclaredFailed,
    TeDraining,
    TeLaunching,
    TePodUp,
    TeReady,
    TeStepDone,
    TeStopped,
    evolve,
)


class ManagerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    jes: tuple[str, ...] = ()
    pods: str = ""  # the pod launcher's address ("": TEs register themselves, nothing is launched)
    monitor: str = ""  # the heartbeat monitor ("": no heartbeats)
    slots: tuple[TeSlot, ...] = ()  # every TE the cluster may hold: initial ones and spare capacity
    groups: dict[str, int] = {}  # group -> initial size (its first slots)
    initial_source: LoadSource = "resident"
    replace_source: LoadSource = "cold"
    heartbeat_timeout_s: float = 0.0  # the TE's responder asks its masters with this timeout
    directory_subscribers: tuple[str, ...] = ()
    drain_poll_s: float = 0.5
    drain_timeout_s: float = 120.0
    boot_timeout_s: float = 600.0
    # A failed boot's slot boots again at once, then after 1, 2, 4 … s up to the cap, for as long
    # as its group wants it (policy.BootBackoff): a link down for a while uses no budget up.
    boot_backoff_s: float = 1.0
    boot_backoff_max_s: float = 30.0
    recovery: L.Recovery = L.Recovery()  # the recovery ladder's rung (ladder.py); default: replace
    spare_servers: tuple[int, ...] = ()  # the servers of the substitution's spare pool
    # KV link routing (kvpaths.py): a replacement, once registered, has the JEs forget its KV paths
    kv_link_routing: bool = False

    def __post_init__(self) -> None:
        names = [s.te for s in self.slots]
        if len(set(names)) != len(names):
            raise ValueError("cluster.slots: two slots name the same TE")
        for g, n in self.groups.items():
            have = sum(1 for s in self.slots if s.group == g)
            if not 0 <= n <= have:
                raise ValueError(f"cluster.groups.{g}: initial size {n} but {have} slots")
        if not (self.drain_poll_s > 0 and self.drain_timeout_s > 0 and self.boot_timeout_s > 0):
            raise ValueError("cluster: drain_poll_s, drain_timeout_s, boot_timeout_s must be > 0")
        if not 0 <= self.boot_backoff_s <= self.boot_backoff_max_s <= 86_400:
            raise ValueError("cluster: boot_backoff_s, boot_backoff_max_s: 0 <= boot_backoff_s <= "
                             f"boot_backoff_max_s <= 86400, got {self.boot_backoff_s}, {self.boot_backoff_max_s}")


class ClusterManager(Actor[CmState]):
    snapshot_every = 4096

    def __init__(self, jes: list[str] | None = None, config: dict[str, Any] | None = None) -> None:
        cfg = dict(config or {})
        if jes is not None:
            cfg["jes"] = list(jes)
        self.cfg = msgspec.convert(cfg, ManagerConfig)
        self.slots = {s.te: s for s in self.cfg.slots}
        self.backoff = P.BootBackoff(base_s=self.cfg.boot_backoff_s, max_s=self.cfg.boot_backoff_max_s)

    def initial_state(self) -> CmState:
        return CmState() if self.cfg.recovery.rung == "replace" else L.LadderState()

    def evolve(self, state: CmState, event: Event) -> CmState:
        if isinstance(event, L.EVENTS):
            return L.evolve(state, event)  # type: ignore[arg-type]
        if type(event) is K.KvPathVerdict or type(event) is H.HealthActed:  # records: the state is elsewhere
            return state
        return evolve(state, event)

    def on_start(self, ctx: Context) -> None:
        if not self.cfg.pods:
            return
        for group in sorted({s.group for s in self.cfg.slots}):
            first = next(s for s in self.cfg.slots if s.group == group)
            size = self.cfg.groups.get(group, 0)
            ctx.record(GroupTarget(group=group, model=first.model, role=first.role, size=size))
            for s in [s for s in self.cfg.slots if s.group == group][:size]:
                self._do(ctx, P.Launch(s.te, 1, self.cfg.initial_source))

    # ---- inputs ------------------------------------------------------------------------------
    def handle(self, ctx: Context, msg: Message) -> None:
        st = self.state
        if isinstance(msg, RegisterTe):
            self._registered(ctx, msg)
        elif isinstance(msg, TeBootStep):
            r = st.tes.get(msg.te)
            if r is not None and r.generation == msg.generation:
                ctx.record(TeStepDone(te=msg.te, generation=msg.generation, step=msg.step,
                                      duration_s=msg.duration_s, detail=msg.detail))  # fmt: skip
        elif isinstance(msg, PodLaunched):
            self._pod_up(ctx, msg)
        elif isinstance(msg, TeFailed):
            self._failed(ctx, msg.te, msg.generation, msg.reason, msg.diagnosis)
        elif isinstance(msg, TeBootFailed | PodFailed):
            self._failed(ctx, msg.te, msg.generation, f"boot failed: {msg.reason}", BOOT)
        elif isinstance(msg, PodExited):
            self._pod_exited(ctx, msg)
        elif isinstance(msg, BootTimeout):
            r = st.tes.get(msg.te)
            if r is not None and r.generation == msg.generation and r.state in ("starting", "replacing"):
                self._failed(ctx, msg.te, msg.generation, f"not registered within {self.cfg.boot_timeout_s:g}s", BOOT)
        elif isinstance(msg, RelaunchTe):
            for a in P.on_relaunch(st, msg.te, msg.generation, self.cfg.replace_source):
                self._do(ctx, a)
        elif isinstance(msg, ScaleGroup):
            self._scale(ctx, msg)
        elif isinstance(msg, DrainTe | RemoveTe):
            self._remove(ctx, msg.te, msg.reason)
        elif isinstance(msg, DrainPoll):
            self._drain_poll(ctx, msg)
        elif isinstance(msg, DpStatus) and msg.req_id.startswith("drain:"):
            self._drain_answer(ctx, msg)
        elif isinstance(msg, CancelOwner):
            self._cancel_owner(ctx, msg)
        elif isinstance(msg, FlipTe):
            flip(self, ctx, msg)
        elif isinstance(msg, L.NodeRepairDue):
            for step in L.on_repaired(st, self.slots, msg.server, self.cfg.replace_source):
                self._do(ctx, step)
        elif isinstance(msg, KvLinkDiagnosis):  # a KV path's verdict, from a host's monitor
            v = K.verdict(self, ctx, msg)
            for step in L.on_kv_verdict(st, self.slots, self.cfg.recovery, v):
                self._do(ctx, step)
        elif isinstance(msg, H.HealthAlert):  # a host's device-health level (device_health)
            H.on_alert(self, ctx, msg)
        elif isinstance(msg, ClusterStatusQuery):
            ctx.reply(ClusterStatus(req_id=msg.req_id, state=msgspec.to_builtins(st)))

    def _registered(self, ctx: Context, msg: RegisterTe) -> None:
        st = self.state
        r = st.tes.get(msg.te)
        if r is not None:
            if self.cfg.kv_link_routing and r.generation > 1 and r.state in ("starting", "replacing"):
                K.reset(self, ctx, msg.te)
            for a in P.on_registered(st, msg.te):
                self._do(ctx, a)
            for step in L.on_ready(self.state, self.slots, msg.te, self.cfg.replace_source):
                self._do(ctx, step)
            return
        # A TE nobody launched (a simulation's builder spawned it): the stand-in's behaviour.
        group = P.group_of(msg.model, msg.role)
        if group not in st.groups:
            ctx.record(GroupTarget(group=group, model=msg.model, role=msg.role, size=0))
        ctx.record(TeReady(te=msg.te, group=group, generation=1, at_s=ctx.now()))
        ctx.record(GroupTarget(group=group, model=msg.model, role=msg.role, size=len(P.active(st, group))))
        self._do(ctx, P.Push(group))
        if self.cfg.monitor:
            self._do(ctx, P.Watch(msg.te, 1))

    def _pod_up(self, ctx: Context, msg: PodLaunched) -> None:
        r = self.state.tes.get(msg.te)
        if r is None or r.pod_id != msg.pod_id or r.state not in ("starting", "replacing"):
            return
        ctx.record(TePodUp(te=msg.te, generation=msg.generation, endpoint=msg.endpoint, duration_s=msg.duration_s))
        if msg.endpoint:
            self._directory(ctx, {msg.te: msg.endpoint, f"{msg.te}/": msg.endpoint}, ())

    def _pod_exited(self, ctx: Context, msg: PodExited) -> None:
        """The launcher saw the TE's process end: failed at once, booting or registered — not
        after the heartbeats' misses, while the JEs still routed to a process that was gone."""
        r = self.state.tes.get(msg.te)
        if r is None or r.generation != msg.generation:
            return
        if r.state in ("starting", "replacing"):
            self._failed(ctx, msg.te, msg.generation, f"boot failed: {msg.reason} during boot", BOOT)
        elif r.state in ("ready", "draining"):
            self._failed(ctx, msg.te, msg.generation, f"its pod exited: {msg.reason}", EXITED)

    def _failed(self, ctx: Context, te: str, generation: int, reason: str, diagnosis: str = "") -> None:
        cfg = self.cfg
        for a in L.on_failed(self.state, self.slots, cfg.recovery, cfg.spare_servers, te, generation, reason,
                             diagnosis, cfg.replace_source, self.backoff):  # fmt: skip
            self._do(ctx, a)

    def _scale(self, ctx: Context, msg: ScaleGroup) -> None:
        st = self.state
        actions = P.on_scale(st, self.cfg.slots, msg.group, msg.size, self.cfg.replace_source,
                             L.blocked_slots(st, self.cfg.slots))  # fmt: skip
        refused = [a for a in actions if isinstance(a, P.Refuse)]
        if refused:
            ctx.record(ScaleRefused(group=msg.group, size=msg.size, reason=refused[0].reason))
            return
        g = st.groups[msg.group]
        ctx.record(GroupTarget(group=msg.group, model=g.model, role=g.role, size=msg.size))
        for a in actions:
            self._do(ctx, a)

    def _remove(self, ctx: Context, te: str, reason: str) -> None:
        r = self.state.tes.get(te)
        if r is None or r.state in ("stopped", "draining") or (r.state == "failed" and r.retry_at_s is None):
            return
        g = self.state.groups[r.group]
        ctx.record(GroupTarget(group=r.group, model=g.model, role=g.role, size=max(g.target - 1, 0)))
        if not self.cfg.pods:  # the stand-in's behaviour: out of the group at once
            self._do(ctx, P.Stop(te, reason))
            return
        # a failed TE waiting out a boot backoff is stopped: its relaunch is off
        ready = r.state == "ready"  # read first: recording the drain makes it "draining"
        self._do(ctx, P.Drain(te, reason) if ready else P.Stop(te, reason))
        if ready:  # the JEs stop routing new work to it now, not when it stops (as `ScaleGroup`)
            self._do(ctx, P.Push(r.group))

    def _cancel_owner(self, ctx: Context, msg: CancelOwner) -> None:
        """A JE is lost (the gateway saw it go): every TE with a shell cancels its tasks, which
        would otherwise run to their end for nobody, holding KV blocks and batch slots."""
        tes = tuple(sorted(te for te, r in self.state.tes.items() if r.state in ("ready", "draining")))
        ctx.record(OwnerCancelled(owner=msg.owner, reason=msg.reason, tes=tes))
        for te in tes:
            ctx.send(te, msg)

    # ---- draining ----------------------------------------------------------------------------
    def _drain_poll(self, ctx: Context, msg: DrainPoll) -> None:
        r = self.state.tes.get(msg.te)
        if r is None or r.generation != msg.generation or r.state != "draining":
            return
        elapsed = ctx.now() - r.since_s
        if elapsed >= self.cfg.drain_timeout_s:
            why = P.drain_finished(1, 0, elapsed, self.cfg.drain_timeout_s) or "drain timeout"
            self._do(ctx, P.Stop(msg.te, why))
            return
        slot = self.slots.get(msg.te)
        for i in range(slot.dp_groups if slot is not None else 1):
            ctx.send(f"{msg.te}/dp/{i}", DpStatusQuery(req_id=f"drain:{msg.te}:{msg.generation}:{i}"))
        ctx.after(self.cfg.drain_poll_s, DrainPoll(te=msg.te, generation=msg.generation), key=f"drain/{msg.te}")

    def _drain_answer(self, ctx: Context, msg: DpStatus) -> None:
        _, te, gen, dp = msg.req_id.split(":")
        r = self.state.tes.get(te)
        if r is None or str(r.generation) != gen or r.state != "draining":
            return
        ld = msg.load
        ctx.record(DrainProbed(te=te, dp=int(dp), busy=ld.waiting + ld.running))
        slot = self.slots.get(te)
        n = slot.dp_groups if slot is not None else 1
        busy = self.state.tes[te].drain_busy
        if len(busy) == n and not any(busy.values()):
            self._do(ctx, P.Stop(te, "drained: no task left"))

    # ---- carrying out decisions --------------------------------------------------------------
    def _do(self, ctx: Context, a: L.Action) -> None:  # noqa: C901 (one branch per action kind)
        st, cfg = self.state, self.cfg
        if isinstance(a, L.Note):
            ctx.record(a.event)
        elif isinstance(a, L.Repair):
            ctx.after(a.delay_s, L.NodeRepairDue(server=a.server), key=f"repair/s{a.server}")
        elif isinstance(a, L.Flip):
            flip(self, ctx, FlipTe(te=a.te, src=a.src, dst=a.dst, reason=a.reason))
        elif isinstance(a, L.DropDp):
            ctx.send(f"{a.te}/hb", HbDropDp(dp=a.dp))
        elif isinstance(a, P.Launch):
            self._launch(ctx, a)
        elif isinstance(a, P.Ready):
            r = st.tes[a.te]
            ctx.cancel(f"boot/{a.te}")
            ctx.record(TeStepDone(te=a.te, generation=a.generation, step="registered",
                                  duration_s=ctx.now() - r.launched_s))  # fmt: skip
            ctx.record(TeReady(te=a.te, group=r.group, generation=a.generation, at_s=ctx.now()))
        elif isinstance(a, P.Fail):
            ctx.cancel(f"boot/{a.te}")
            ctx.record(TeDeclaredFailed(te=a.te, generation=a.generation, reason=a.reason, at_s=ctx.now(),
                                        diagnosis=a.diagnosis))  # fmt: skip
        elif isinstance(a, P.Stop | P.StopPodOnly):
            r = st.tes[a.te]
            was_member = r.state in ("ready", "draining")
            if cfg.pods and r.pod_id:
                ctx.send(cfg.pods, StopPod(pod_id=r.pod_id, te=a.te, reason=a.reason, reply_to=ctx.self))
            ctx.cancel(f"drain/{a.te}")
            ctx.cancel(f"boot/{a.te}")
            if isinstance(a, P.Stop):
                ctx.cancel(f"relaunch/{a.te}")
                ctx.record(TeStopped(te=a.te, generation=r.generation, reason=a.reason, at_s=ctx.now()))
                self._do(ctx, P.Unwatch(a.te))
                if was_member:
                    self._do(ctx, P.Push(r.group))
            if r.endpoint:
                self._directory(ctx, {}, (a.te, f"{a.te}/"))
        elif isinstance(a, P.Drain):
            r = st.tes[a.te]
            ctx.record(TeDraining(te=a.te, generation=r.generation, reason=a.reason, at_s=ctx.now()))
            ctx.after(cfg.drain_poll_s, DrainPoll(te=a.te, generation=r.generation), key=f"drain/{a.te}")
        elif isinstance(a, P.Backoff):
            ctx.record(TeBootBackoff(te=a.te, generation=a.generation, failures=a.failures, delay_s=a.delay_s,
                                     retry_at_s=ctx.now() + a.delay_s))  # fmt: skip
            ctx.after(a.delay_s, RelaunchTe(te=a.te, generation=a.generation), key=f"relaunch/{a.te}")
        elif isinstance(a, P.Push):
            self._push(ctx, a.group)
        elif isinstance(a, P.Watch):
            if cfg.monitor:
                ctx.send(cfg.monitor, WatchTe(te=a.te, generation=a.generation))
        elif isinstance(a, P.Unwatch):
            if cfg.monitor:
                ctx.send(cfg.monitor, UnwatchTe(te=a.te))

    def _launch(self, ctx: Context, a: P.Launch) -> None:
        slot = self.slots.get(a.te)
        if slot is None or not self.cfg.pods:
            return
        slot = L.slot_of(self.state, slot)
        pid = pod_id(a.te, a.generation)
        r = self.state.tes.get(a.te)  # a replacement stays in the group its TE was flipped to (flip.py)
        group = r.group if a.replacing and r is not None else slot.group
        ctx.record(TeLaunching(te=a.te, group=group, generation=a.generation, pod_id=pid,
                               source=a.source, at_s=ctx.now(), replacing=a.replacing))  # fmt: skip
        ctx.send(self.cfg.pods, LaunchPod(
            pod_id=pid, te=a.te, role=slot.role, model=slot.model, generation=a.generation, slot=slot,
            source=a.source, manager=ctx.self, heartbeat_timeout_s=self.cfg.heartbeat_timeout_s,
            reply_to=ctx.self,
        ))  # fmt: skip
        ctx.after(self.cfg.boot_timeout_s, BootTimeout(te=a.te, generation=a.generation), key=f"boot/{a.te}")

    def _push(self, ctx: Context, group: str) -> None:
        g = self.state.groups.get(group)
        if g is None:
            return
        tes, draining = P.membership(self.state, group)
        ctx.record(MembershipPushed(group=group, tes=tes, draining=draining))
        # the ladder's moves, read from the recorded state (TeRelocated): a member booted from DRAM
        # or cold asked nobody for its weights, so only this push tells the fork coordinator where it is
        moved = getattr(self.state, "placed", {})
        placed = {te: L.slot_of(self.state, self.slots[te]).npus for te in tes if te in moved and te in self.slots}
        for je in self.cfg.jes:
            ctx.send(je, TeGroupMembership(model=g.model, role=g.role, tes=tes, draining=draining,  # type: ignore[arg-type]
                                           version=self.state.version, placed=placed))  # fmt: skip

    def _directory(self, ctx: Context, routes: dict[str, str], removed: tuple[str, ...]) -> None:
        ctx.record(DirectoryChanged(routes=routes, removed=removed))
        st = self.state
        for sub in self.cfg.directory_subscribers:
            ctx.send(sub, DirectoryUpdate(version=st.dir_version, routes=dict(st.directory), removed=removed))
