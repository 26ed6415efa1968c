"""DRAM pre-loading (DeepServe §6.2), at `cluster/preload`: the control plane predicts which
models will scale and reads them into the page cache of the hosts where they would scale, so a
scale-out's TE-Load is a DRAM hit (PCIe only) instead of a miss (SSD, then PCIe).

The prediction is a policy (`[scaling] dram_preload`): `spare` — every group's model will scale
onto the servers of its spare slots (the `dram_preload_servers` with the most spare slots, 0: all).
`order_slots` then puts, in each group, the spare slots on pre-loaded servers first, so the
manager's scale-out (which takes free slots in order) prefers the pre-warmed TEs on hosts that
already hold the model. Each boot's `te_load` step says dram-hit or dram-miss. A later
prediction (an autoscaler's) arrives as `PreloadModel(model, hosts)`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.ports.host import HostLoadFailed, HostPreload, HostPreloaded
from deepserve.actors.ports.pod import TeSlot
from deepserve.core import Actor, Context, Event, Message

from .messages import PreloadModel
from .prewarm import Scaling


def preload_plan(cfg: Scaling, slots: tuple[TeSlot, ...], groups: dict[str, int]) -> tuple[tuple[str, str], ...]:
    """(host, model) pairs to pre-load: the prediction (module docstring)."""
    if not cfg.enabled or cfg.dram_preload == "off":
        return ()
    out: dict[tuple[str, str], None] = {}
    for group in sorted({s.group for s in slots}):
        spare = [s for s in slots if s.group == group][groups.get(group, 0):]
        count: dict[int, int] = {}
        for s in spare:
            count[s.server] = count.get(s.server, 0) + 1
        servers = sorted(count, key=lambda sv: (-count[sv], sv))  # the most room to scale into first
        keep = set(servers[: cfg.dram_preload_servers] if cfg.dram_preload_servers else servers)
        for s in spare:
            if s.server in keep:
                out[(s.host, s.model)] = None
    return tuple(out)


def order_slots(slots: tuple[TeSlot, ...], groups: dict[str, int],
                plan: tuple[tuple[str, str], ...]) -> tuple[TeSlot, ...]:  # fmt: skip
    """Each group's initial slots unchanged; its spare slots on hosts pre-loaded with its model first."""
    warm = set(plan)
    seen: dict[str, int] = {}
    initial: list[TeSlot] = []
    spare: list[TeSlot] = []
    for s in slots:
        n = seen.get(s.group, 0)
        seen[s.group] = n + 1
        (initial if n < groups.get(s.group, 0) else spare).append(s)
    spare.sort(key=lambda s: (s.host, s.model) not in warm)  # stable: slot order otherwise
    return (*initial, *spare)


class PreloadState(msgspec.Struct, kw_only=True):
    asked: dict[str, str] = {}  # "host|model" -> "asked", "hit", "loaded", "failed: ..."
    seconds: dict[str, float] = {}  # "host|model" -> how long the read took


class PreloadAsked(Event, frozen=True, kw_only=True):
    host: str
    model: str


class PreloadEnded(Event, frozen=True, kw_only=True):
    host: str
    model: str
    outcome: str  # hit (already cached), loaded, failed: why
    duration_s: float


class DramPreloader(Actor[PreloadState]):
    def __init__(self, plan: Any = ()) -> None:
        self.plan = tuple((str(h), str(m)) for h, m in plan)

    def initial_state(self) -> PreloadState:
        return PreloadState()

    def evolve(self, s: PreloadState, e: Event) -> PreloadState:
        if isinstance(e, PreloadAsked):
            s.asked[f"{e.host}|{e.model}"] = "asked"
        elif isinstance(e, PreloadEnded):
            s.asked[f"{e.host}|{e.model}"] = e.outcome
            s.seconds[f"{e.host}|{e.model}"] = e.duration_s
        return s

    def on_start(self, ctx: Context) -> None:
        for host, model in self.plan:
            self._ask(ctx, host, model)

    def _ask(self, ctx: Context, host: str, model: str) -> None:
        if self.state.asked.get(f"{host}|{model}") in ("asked", "hit", "loaded"):
            return  # asked already (one that failed is asked again)
        ctx.record(PreloadAsked(host=host, model=model))
        ctx.send(host, HostPreload(req_id=f"preload:{model}", model=model))

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, PreloadModel):
            for host in msg.hosts[:4096]:  # a limit on everything
                self._ask(ctx, host, msg.model)
        elif isinstance(msg, HostPreloaded | HostLoadFailed) and msg.req_id.startswith("preload:"):
            if self.state.asked.get(f"{ctx.sender}|{msg.model}") != "asked":
                return
            if isinstance(msg, HostPreloaded):
                outcome, took = ("hit" if msg.hit else "loaded"), msg.duration_s
            else:
                outcome, took = f"failed: {msg.reason}", 0.0
            ctx.record(PreloadEnded(host=ctx.sender, model=msg.model, outcome=outcome, duration_s=took))
