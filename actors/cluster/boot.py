"""A TE's bootstrap inside its pod (DeepServe §6, steps 2–4), at `{te}/boot`:

- TE-Pre-Load: FlowServe's start (Python, NPU init, HCCL) — `te_preload_s` of the launcher's
  config (the paper gives no figure in its text; Fig. 9 only ranks it the largest step);
- TE-Load, by `source`: `cold` reads the model file from SSD into the host's DRAM page cache
  (`HostPreload`; a DRAM hit reads nothing and says so), then moves each DP group's shards to its
  NPUs (`HostLoad`: PCIe + tensor initialisation, priced by the host's performance model);
  `resident` weights are on the NPUs already (the initial deployment);
- TE-Post-Load: the TE shell (which spawns its DP masters) and, when heartbeats are on, the
  heartbeat responder `{te}/hb`; then `RegisterTe` to the manager (Scaler-Post is the manager's).

Each step's duration goes to the manager (`TeBootStep`); a failed load ends in `TeBootFailed`.

With `[scaling]` on (the launcher passes `scale`, actors/cluster/prewarm.py) the steps are
DeepServe Table 2's: `scaler_pre` (the pod: pre-warmed or created), `te_pre_load` (a pre-warmed
TE or a cold start), `te_load` (NPU-fork from a running TE, asked of `cluster/fork`; else one
`HostLoad` per DP group straight from the page cache — dram-hit — or the SSD — dram-miss),
`te_post_load` (the shell starts, its RTC executors allocate the profiled KV blocks
asynchronously, one dummy request warms each DP group up). `dram` and `fork` also boot without
`scale` (a launcher that does not plan: no scaler_pre step, no warm-up).
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.flowserve.messages import RegisterTe
from deepserve.actors.ports.host import (
    HostLoad,
    HostLoadDone,
    HostLoadFailed,
    HostPreload,
    HostPreloaded,
)
from deepserve.actors.ports.npu import NpuError, NpuForward, NpuForwardDone, SeqShape
from deepserve.actors.ports.pod import IMPLEMENTED_SOURCES, BootSpec
from deepserve.core import Actor, Context, Event, Message

from .messages import BootStepName, ForkLoaded, ForkNone, ForkRequest, TeBootFailed, TeBootStep


class BootScale(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the launcher's plan tells the bootstrap (prewarm.BootPlan, as data)."""

    scaler_pre_s: float = 0.0
    scaler_pre_detail: str = ""
    pre_load_detail: str = ""
    forker: str = ""  # the fork coordinator ("": no NPU-fork)
    warmup: bool = True


class BootState(msgspec.Struct, kw_only=True):
    phase: str = "new"  # new, pre_load, ssd_to_dram, dram_to_npu, fork, te_load, warmup, up, failed
    phase_s: float = 0.0  # when the phase began
    loaded: list[int] = []  # DP groups whose weights arrived
    load_s: float = 0.0  # the longest DP group's load (they run side by side)
    path: str = ""


class ScaleBootState(BootState, kw_only=True):
    """A fast-scaling boot's state (sources dram and fork): also why no fork happened."""

    fork_none: str = ""


class BootForkNone(Event, frozen=True, kw_only=True):
    reason: str


class BootPhase(Event, frozen=True, kw_only=True):
    phase: str
    at_s: float


class BootGroupLoaded(Event, frozen=True, kw_only=True):
    dp: int
    duration_s: float
    path: str


class PreLoadDone(Message, frozen=True):
    """The bootstrap's timer: TE-Pre-Load is over."""


class TeBoot(Actor[BootState]):
    def __init__(self, spec: Any, scale: Any = None) -> None:
        self.spec = spec if isinstance(spec, BootSpec) else msgspec.convert(spec, BootSpec)
        if self.spec.source not in IMPLEMENTED_SOURCES:
            raise ValueError(f"source: {self.spec.source!r} is not implemented yet ({', '.join(IMPLEMENTED_SOURCES)})")
        self.slot = self.spec.slot
        self.scale = None if scale is None else msgspec.convert(scale, BootScale)

    def initial_state(self) -> BootState:
        return ScaleBootState() if self.spec.source in ("dram", "fork") else BootState()

    def evolve(self, s: BootState, e: Event) -> BootState:
        if isinstance(e, BootPhase):
            s.phase, s.phase_s = e.phase, e.at_s
            if e.phase in ("dram_to_npu", "te_load", "warmup"):
                s.loaded, s.load_s = [], 0.0
        elif isinstance(e, BootForkNone) and isinstance(s, ScaleBootState):
            s.fork_none = e.reason
        elif isinstance(e, BootGroupLoaded):
            s.loaded.append(e.dp)
            s.load_s, s.path = max(s.load_s, e.duration_s), e.path
        return s

    def on_start(self, ctx: Context) -> None:
        if self.spec.source == "resident":
            self._post_load(ctx)
            return
        if self.scale is not None:
            self._step(ctx, "scaler_pre", self.scale.scaler_pre_s, self.scale.scaler_pre_detail)
        ctx.record(BootPhase(phase="pre_load", at_s=ctx.now()))
        ctx.after(self.spec.te_preload_s, PreLoadDone(), key="preload")

    def handle(self, ctx: Context, msg: Message) -> None:
        st, slot = self.state, self.slot
        if self.spec.source in ("dram", "fork") and self._fast(ctx, msg):
            return
        if isinstance(msg, PreLoadDone) and st.phase == "pre_load":
            self._step(ctx, "te_pre_load", ctx.now() - st.phase_s)
            ctx.record(BootPhase(phase="ssd_to_dram", at_s=ctx.now()))
            ctx.send(slot.host, HostPreload(req_id=f"{self.spec.pod_id}:preload", model=slot.model))
        elif isinstance(msg, HostPreloaded) and st.phase == "ssd_to_dram":
            self._step(ctx, "ssd_to_dram", msg.duration_s, "dram-hit" if msg.hit else "ssd")
            ctx.record(BootPhase(phase="dram_to_npu", at_s=ctx.now()))
            for g in range(slot.dp_groups):
                npus = slot.npus[g * slot.tp:(g + 1) * slot.tp]
                ctx.send(slot.host, HostLoad(req_id=f"{self.spec.pod_id}:load:{g}", model=slot.model, targets=npus))
        elif isinstance(msg, HostLoadDone) and st.phase == "dram_to_npu":
            dp = int(msg.req_id.rpartition(":")[2])
            if dp in st.loaded:
                return
            ctx.record(BootGroupLoaded(dp=dp, duration_s=msg.duration_s, path=msg.path))
            if len(self.state.loaded) == slot.dp_groups:
                self._step(ctx, "dram_to_npu", ctx.now() - st.phase_s, self.state.path)
                self._post_load(ctx)
        elif isinstance(msg, HostLoadFailed) and st.phase in ("ssd_to_dram", "dram_to_npu"):
            ctx.record(BootPhase(phase="failed", at_s=ctx.now()))
            ctx.send(self.spec.manager, TeBootFailed(te=slot.te, generation=self.spec.generation,
                                                     pod_id=self.spec.pod_id, reason=msg.reason))  # fmt: skip

    # ---- the fast-scaling path (sources dram and fork) -----------------------------------------
    def _fast(self, ctx: Context, msg: Message) -> bool:  # noqa: C901 (one branch per input)
        st, slot, sc = self.state, self.slot, self.scale
        if isinstance(msg, PreLoadDone) and st.phase == "pre_load":
            self._step(ctx, "te_pre_load", ctx.now() - st.phase_s, sc.pre_load_detail if sc else "")
            if self.spec.source == "fork" and sc is not None and sc.forker:
                ctx.record(BootPhase(phase="fork", at_s=ctx.now()))
                ctx.send(sc.forker, ForkRequest(te=slot.te, generation=self.spec.generation, model=slot.model,
                                                tp=slot.tp, server=slot.server, npus=slot.npus, reply_to=ctx.self))  # fmt: skip
            else:
                self._local_load(ctx)
        elif isinstance(msg, ForkLoaded) and st.phase == "fork":
            self._step(ctx, "te_load", ctx.now() - st.phase_s, f"{msg.path} from {msg.source} ({msg.fork_id})")
            self._post_load(ctx)
        elif isinstance(msg, ForkNone) and st.phase == "fork":
            ctx.record(BootForkNone(reason=msg.reason))
            self._local_load(ctx)
        elif isinstance(msg, HostLoadDone) and st.phase == "te_load":
            dp = int(msg.req_id.rpartition(":")[2])
            if dp in st.loaded:
                return True
            ctx.record(BootGroupLoaded(dp=dp, duration_s=msg.duration_s, path=msg.path))
            if len(self.state.loaded) == slot.dp_groups:
                # ssd-shared: the host joined another boot's in-flight read of the file
                path = {"dram-hit": "dram-hit", "ssd-shared": "dram-miss-shared (ssd read joined)"}.get(
                    self.state.path, "dram-miss (ssd)")
                why = getattr(self.state, "fork_none", "")
                self._step(ctx, "te_load", ctx.now() - self.state.phase_s, f"{path}; no fork: {why}" if why else path)
                self._post_load(ctx)
        elif isinstance(msg, NpuForwardDone | NpuError) and st.phase == "warmup" and msg.req_id.startswith(
                f"{self.spec.pod_id}:warmup:"):  # fmt: skip
            self._warmed(ctx, msg)
        elif isinstance(msg, HostLoadFailed) and st.phase in ("te_load", "fork"):
            ctx.record(BootPhase(phase="failed", at_s=ctx.now()))
            ctx.send(self.spec.manager, TeBootFailed(te=slot.te, generation=self.spec.generation,
                                                     pod_id=self.spec.pod_id, reason=msg.reason))  # fmt: skip
        else:
            return False
        return True

    def _local_load(self, ctx: Context) -> None:
        """TE-Load from this host: each DP group's shards from the page cache, or the SSD on a miss."""
        slot = self.slot
        ctx.record(BootPhase(phase="te_load", at_s=ctx.now()))
        for g in range(slot.dp_groups):
            npus = slot.npus[g * slot.tp:(g + 1) * slot.tp]
            ctx.send(slot.host, HostLoad(req_id=f"{self.spec.pod_id}:load:{g}", model=slot.model, targets=npus))

    def _warmed(self, ctx: Context, msg: NpuForwardDone | NpuError) -> None:
        slot, st = self.slot, self.state
        if isinstance(msg, NpuError):
            ctx.record(BootPhase(phase="failed", at_s=ctx.now()))
            ctx.send(self.spec.manager, TeBootFailed(te=slot.te, generation=self.spec.generation, pod_id=self.spec.pod_id,
                                                     reason=f"warm-up failed on {msg.device}: {msg.reason}"))  # fmt: skip
            return
        dp = int(msg.req_id.rpartition(":")[2])
        if dp in st.loaded:
            return
        ctx.record(BootGroupLoaded(dp=dp, duration_s=msg.duration_s, path="warmup"))
        if len(self.state.loaded) == slot.dp_groups:
            self._register(ctx, ctx.now() - self.state.phase_s, "1 dummy request per DP group")

    def _step(self, ctx: Context, step: BootStepName, duration_s: float, detail: str = "") -> None:
        ctx.send(self.spec.manager, TeBootStep(te=self.slot.te, generation=self.spec.generation,
                                               pod_id=self.spec.pod_id, step=step, duration_s=duration_s,
                                               detail=detail))  # fmt: skip

    def _post_load(self, ctx: Context) -> None:
        from deepserve.actors.flowserve.te_shell import TeShell

        from .responder import HbResponder

        spec, slot = self.spec, self.slot
        ctx.record(BootPhase(phase="up", at_s=ctx.now()))
        ctx.spawn(slot.te, TeShell, config=dict(slot.te_config))
        if spec.heartbeat_timeout_s > 0:
            ctx.spawn(f"{slot.te}/hb", HbResponder, te=slot.te, generation=spec.generation,
                      dp_groups=slot.dp_groups, timeout_s=spec.heartbeat_timeout_s,
                      # every NPU (the device watch's): DP group g's at [g*tp, (g+1)*tp)
                      npus=tuple(slot.npus[:slot.dp_groups * slot.tp]))  # fmt: skip
        if self.scale is None or spec.source == "resident":
            self._step(ctx, "post_load", 0.0)
            self._announce(ctx)
        elif self.scale.warmup:
            ctx.record(BootPhase(phase="warmup", at_s=ctx.now()))  # resets `loaded`: the warm-ups' turn
            for g in range(slot.dp_groups):
                ctx.send(slot.npus[g * slot.tp], NpuForward(
                    req_id=f"{spec.pod_id}:warmup:{g}", model=slot.model, seqs=(SeqShape(1, 0),), tp=slot.tp,
                    sample=True, regions=("weights",)))  # fmt: skip
        else:
            self._register(ctx, 0.0, "no warm-up")

    def _register(self, ctx: Context, duration_s: float, warmup: str) -> None:
        dps = self.slot.te_config.get("dps") or [{}]
        kv = f"KV {dps[0].get('hbm_blocks', 0)} blocks x {dps[0].get('kv_block_bytes', 0)} B per NPU (profiled sizes, allocated async)"
        self._step(ctx, "te_post_load", duration_s, f"{kv}; warm-up: {warmup}")
        ctx.record(BootPhase(phase="up", at_s=ctx.now()))
        self._announce(ctx)

    def _announce(self, ctx: Context) -> None:
        spec, slot = self.spec, self.slot
        ctx.send(spec.manager, RegisterTe(te=slot.te, model=slot.model, role=slot.role,
                                          dp_groups=slot.dp_groups, npus=slot.npus))  # fmt: skip
