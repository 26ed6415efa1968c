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
from deepserve.actors.ports.pod import IMPLEMENTED_SOURCES, BootSpec
from deepserve.core import Actor, Context, Event, Message

from .messages import BootStepName, TeBootFailed, TeBootStep


class BootState(msgspec.Struct, kw_only=True):
    phase: str = "new"  # new, pre_load, ssd_to_dram, dram_to_npu, up, failed
    phase_s: float = 0.0  # when the phase began
    loaded: list[int] = []  # DP groups whose weights arrived
    load_s: float = 0.0  # the longest DP group's load (they run side by side)
    path: str = ""


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
    def __init__(self, spec: Any) -> None:
        self.spec = spec if isinstance(spec, BootSpec) else msgspec.convert(spec, BootSpec)
        if self.spec.source not in IMPLEMENTED_SOURCES:
            raise ValueError(f"source: {self.spec.source!r} is not implemented yet ({', '.join(IMPLEMENTED_SOURCES)})")
        self.slot = self.spec.slot

    def initial_state(self) -> BootState:
        return BootState()

    def evolve(self, s: BootState, e: Event) -> BootState:
        if isinstance(e, BootPhase):
            s.phase, s.phase_s = e.phase, e.at_s
            if e.phase == "dram_to_npu":
                s.loaded, s.load_s = [], 0.0
        elif isinstance(e, BootGroupLoaded):
            s.loaded.append(e.dp)
            s.load_s, s.path = max(s.load_s, e.duration_s), e.path
        return s

    def on_start(self, ctx: Context) -> None:
        if self.spec.source == "resident":
            self._post_load(ctx)
            return
        ctx.record(BootPhase(phase="pre_load", at_s=ctx.now()))
        ctx.after(self.spec.te_preload_s, PreLoadDone(), key="preload")

    def handle(self, ctx: Context, msg: Message) -> None:
        st, slot = self.state, self.slot
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
                      npus=tuple(slot.npus[g * slot.tp] for g in range(slot.dp_groups)))  # fmt: skip
        self._step(ctx, "post_load", 0.0)
        ctx.send(spec.manager, RegisterTe(te=slot.te, model=slot.model, role=slot.role,
                                          dp_groups=slot.dp_groups, npus=slot.npus))  # fmt: skip
