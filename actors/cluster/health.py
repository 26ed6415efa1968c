"""A host's device-health monitor (P/D-Serve §3.4: "a customized container (with resident
process) ... is deployed per node ... regularly detects the faults and records the results (xPU
status) ... the faults are classified into multiple levels, in which some are recoverable without
node-level recovery"). One per server, at `hw/sN/health` by convention.

It asks each of its NPUs for its status once, with a lease (the device promises word of any fault:
`NpuLeaseBroken`, as for the heartbeat monitor's leases), and asks again whenever a lease breaks —
so nothing ticks while the host is healthy and a simulation's clock is not kept running. The KV
paths' probers (distflow/probe.py) report their verdicts here too (`KvLinkDiagnosis`). Every
change of a device's condition is recorded (`DeviceHealth`) with its level:

- `recoverable-in-place`: a transient link error (token recomputation rolls it back), a faulty
  part of the KV region (HBM fault masking), a saturated or flapping KV path;
- `instance`: a crashed or hung NPU, a faulted region the TE cannot do without (weights, the
  whole KV region), a KV link that carries nothing: the TE on it is replaced;
- `node`: at least `node_fraction` of the host's NPUs at instance level at once: the node is
  gone, its instances are substituted elsewhere (`NodeDown`, recorded once until it recovers).

Each record also goes to `report_to` (the cluster manager or a recovery policy) when set. With
`act` (`cluster.resilience.device_health`: the cluster manager acts on each level, healthacts.py)
the reports are `HealthAlert`s, and a node going down is reported before the device that took
it there, so that device's TE is replaced off the tainted node rather than on it.
"""

from __future__ import annotations

import msgspec

from deepserve.actors.flowserve.distflow.probe import LINK_FAULT, KvLinkDiagnosis
from deepserve.actors.ports.npu import CRASHED, RESET, NpuError, NpuLeaseBroken, NpuProbe, NpuStatus
from deepserve.core import Actor, AskFailed, Context, Event, Message

from . import kvpaths

HEALTHY = "healthy"
RECOVERABLE = "recoverable-in-place"
INSTANCE = "instance"
NODE = "node"
LEVELS = ("", RECOVERABLE, INSTANCE, NODE)  # "": healthy
LEASE_S = 1e9  # "until the device says otherwise": asked again only when a lease breaks


class HealthConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    host: str  # the server's name (hw/s0)
    npus: tuple[str, ...]
    probe_timeout_s: float = 1.0  # an NPU silent this long is hung
    node_fraction: float = 0.5  # this share of NPUs at instance level: the node is down
    report_to: str = ""
    # KV link routing (issue 33, kvpaths.py): each KV path verdict goes on to `report_to` (the
    # cluster manager, which tells the JEs), and a blocked path is probed again every this many
    # seconds until a dummy payload gets through (verdict `healthy`). 0: off (records only).
    reprobe_s: float = 0.0
    fabric: str = "hw/fabric"
    probe_bytes: int = 4096
    act: bool = False  # `report_to` acts on the levels (healthacts.py): reports are HealthAlerts, node first

    def __post_init__(self) -> None:
        if not self.npus or not self.probe_timeout_s > 0 or not 0 < self.node_fraction <= 1:
            raise ValueError("HealthConfig: npus non-empty, probe_timeout_s > 0, node_fraction in (0, 1]")
        if self.reprobe_s < 0 or self.probe_bytes < 1:
            raise ValueError("HealthConfig: reprobe_s >= 0, probe_bytes >= 1")


class DeviceHealth(Event, frozen=True, kw_only=True):
    device: str
    kind: str  # healthy, crash, hang, hbm-fault, link-error, link-fault, saturation, transient
    level: str  # LEVELS ("" when healthy)
    detail: str = ""
    at_s: float


class NodeDown(Event, frozen=True, kw_only=True):
    host: str
    down: bool  # False: back below the threshold
    devices: tuple[str, ...]
    at_s: float


class HealthReport(Message, frozen=True, kw_only=True):
    """Monitor → `report_to`: a device's condition changed (or the node's: `device` is the host)."""

    host: str
    device: str
    kind: str
    level: str
    detail: str = ""


class HealthAlert(HealthReport, frozen=True, kw_only=True):
    """A `HealthReport` its receiver acts on (`HealthConfig.act`; the cluster manager,
    healthacts.py). A type of its own: a plain report, which the manager leaves alone (KV link
    routing's monitors send those), encodes as before."""


class HealthState(msgspec.Struct, kw_only=True):
    devices: dict[str, list[str]] = {}  # device -> [kind, level]
    node_down: bool = False
    asked: int = 0
    blocked: dict[str, str] = {}  # KV paths re-probed until healthy ("src>dst" -> the dummy in flight, "": none)
    reprobes: int = 0


class HealthAsked(Event, frozen=True, kw_only=True):
    device: str


def classify_hbm(faulted: tuple[str, ...]) -> str:
    """The level of an NPU's faulted regions: parts of the KV region (`kv@lo-hi`) are masked in
    place; a whole region, or the weights, take the instance down."""
    if not faulted:
        return ""
    return RECOVERABLE if all(f.startswith("kv@") for f in faulted) else INSTANCE


def classify_lease(reason: str) -> tuple[str, str] | None:
    """(kind, level) a broken lease's reason says by itself, or None: ask the device."""
    if reason.startswith("NpuLinkError"):
        return "link-error", RECOVERABLE
    return None


class DeviceHealthMonitor(Actor[HealthState]):
    def __init__(self, config: object) -> None:
        self.cfg = config if isinstance(config, HealthConfig) else msgspec.convert(config, HealthConfig)

    def initial_state(self) -> HealthState:
        return HealthState()

    def evolve(self, s: HealthState, e: Event) -> HealthState:
        if isinstance(e, kvpaths.KvPathWatched):
            kvpaths.evolve(s, e)
        elif isinstance(e, DeviceHealth):
            s.devices[e.device] = [e.kind, e.level]
        elif isinstance(e, NodeDown):
            s.node_down = e.down
        elif isinstance(e, HealthAsked):
            s.asked += 1
        return s

    def on_start(self, ctx: Context) -> None:
        for npu in self.cfg.npus:
            self._ask(ctx, npu)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, NpuStatus):
            level = classify_hbm(msg.faulted_regions)
            kind = "hbm-fault" if level else HEALTHY
            self._set(ctx, msg.device, kind, level, ", ".join(msg.faulted_regions))
        elif isinstance(msg, NpuError):
            if msg.kind == RESET:  # a hung device was reset: its state now is the answer to a new ask
                self._ask(ctx, msg.device)
            elif msg.kind == CRASHED:
                self._set(ctx, msg.device, "crash", INSTANCE, msg.reason)
        elif isinstance(msg, AskFailed) and msg.target in self.cfg.npus:
            self._set(ctx, msg.target, "hang", INSTANCE, f"no answer within {self.cfg.probe_timeout_s:g}s")
            # A plain probe waits in the hung device's queue: its reset answers it (`RESET` above)
            ctx.send(msg.target, NpuProbe(req_id=f"health:{msg.target}"))
        elif isinstance(msg, NpuLeaseBroken) and msg.device in self.cfg.npus:
            said = classify_lease(msg.reason)
            if said is not None:
                self._set(ctx, msg.device, said[0], said[1], msg.reason)
            self._ask(ctx, msg.device)  # its condition now (and a new lease)
        elif isinstance(msg, KvLinkDiagnosis) and msg.dst in self.cfg.npus:
            level = INSTANCE if msg.verdict == LINK_FAULT else RECOVERABLE
            self._set(ctx, msg.dst, msg.verdict, level, f"KV path from {msg.src}" + (f" over {msg.link}" if msg.link else ""))
            if self.cfg.reprobe_s > 0:
                kvpaths.diagnosed(self, ctx, msg)
        elif self.cfg.reprobe_s > 0 and kvpaths.handles(msg):
            kvpaths.handle(self, ctx, msg)

    def _ask(self, ctx: Context, npu: str) -> None:
        ctx.record(HealthAsked(device=npu))
        key = f"health@{self.cfg.host}"
        probe = NpuProbe(req_id=f"health:{npu}", lease_s=LEASE_S, lease_to=ctx.self, lease_key=key)
        ctx.ask(npu, probe, self.cfg.probe_timeout_s)

    def _set(self, ctx: Context, device: str, kind: str, level: str, detail: str) -> None:
        st, cfg = self.state, self.cfg
        was = st.devices.get(device)
        if was == [kind, level] or (was is None and kind == HEALTHY):
            return  # no change (a device first seen healthy is not news)
        ctx.record(DeviceHealth(device=device, kind=kind, level=level, detail=detail, at_s=ctx.now()))
        report = HealthAlert if cfg.act else HealthReport
        if cfg.report_to and not cfg.act:
            ctx.send(cfg.report_to, report(host=cfg.host, device=device, kind=kind, level=level, detail=detail))
        down = tuple(d for d in cfg.npus if st.devices.get(d, ["", ""])[1] == INSTANCE)
        is_down = len(down) >= cfg.node_fraction * len(cfg.npus)
        if is_down != st.node_down:
            ctx.record(NodeDown(host=cfg.host, down=is_down, devices=down, at_s=ctx.now()))
            if cfg.report_to:
                ctx.send(cfg.report_to, report(host=cfg.host, device=cfg.host, kind="node",
                                               level=NODE if is_down else "", detail=", ".join(down)))  # fmt: skip
        if cfg.report_to and cfg.act:  # after the node's: its TE's replacement avoids a node just gone
            ctx.send(cfg.report_to, report(host=cfg.host, device=device, kind=kind, level=level, detail=detail))
