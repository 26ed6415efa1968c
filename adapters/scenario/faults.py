"""A scenario's fault plan (`[[faults]]`): faults at virtual times, so an SRE can run an incident
as a simulation from the CLI, with `deepserve fault`'s kinds and names.

    [[faults]]
    at_s = 30.0
    kind = "link-down"
    target = "s0/npu0/roce"

Kinds and their targets:
- hardware: `npu-crash`, `hang-npu`, `hbm-fault` (`region`; `span` [lo, hi]: only that part of
  it, which `cluster.resilience.hbm_masking` can mask), `npu-reset` (a repair: a no-op on a
  healthy device), `link-error` (a transient collective-link error: the pass running fails,
  the device stays healthy; `cluster.resilience.token_recompute` rolls it back) on an NPU (hw/s0/npu3); `link-down`, `link-up`, `link-degrade` (`bw_factor`),
  `link-flap` (`down_s`, `up_s`, `count`) on a link (s0/npu3/roce);
- the platform's (the control plane must be running): `kill-te` (te/1: its pod dies and tells no
  one — the heartbeats find it), `kill-te-process` (te/1: its process dies, the pod launcher sees
  it and the manager fails it at once), `kill-je` (je/0: the JE stops; the gateway, whose
  connection to it broke, retries its jobs elsewhere or fails them naming it), `heartbeat-loss`
  (te/1, `duration_s`: its heartbeat answers are lost on the way to the monitor).

Each fault becomes external inputs at its time (to the NPU, the fabric, the pod launcher, the
monitor, or the JE and the gateway), so it is logged and replay re-injects it. Data and checks
here; the run injects them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec

from deepserve.actors.cluster.messages import LoseHeartbeats
from deepserve.actors.gateway.messages import JeLost
from deepserve.actors.ports.faults import (
    HbmRegionFault,
    LinkDegrade,
    LinkDown,
    LinkFlap,
    LinkUp,
    NpuCrash,
    NpuHang,
    NpuLinkError,
    NpuReset,
)
from deepserve.actors.ports.npu import DEFAULT_REGIONS
from deepserve.actors.ports.pod import KillPod
from deepserve.core import Message
from deepserve.core.messages import Stop

NPU_KINDS = ("npu-crash", "hang-npu", "hbm-fault", "npu-reset", "link-error")
LINK_KINDS = ("link-down", "link-up", "link-degrade", "link-flap")
TE_KINDS = ("kill-te", "kill-te-process", "heartbeat-loss")
JE_KINDS = ("kill-je",)
KINDS = NPU_KINDS + LINK_KINDS + TE_KINDS + JE_KINDS
FLAP_FIELDS = ("down_s", "up_s", "count")
MAX_FAULTS = 10_000
FABRIC = "hw/fabric"
FAULT_SRC = "ext/fault"
# Where the platform's faults go (the assembly's addresses: cluster/control.py, cluster/assembly.py's
# gateway): overridable per run through `Wiring`.
PODS_ADDR, MONITOR_ADDR, GATEWAY_ADDR = "pods", "cluster/heartbeat", "gateway"
_TE = re.compile(r"te/[0-9]+")
_JE = re.compile(r"je/[0-9]+")


class Wiring(msgspec.Struct, frozen=True, kw_only=True):
    """The addresses the platform's fault kinds are sent to."""

    pods: str = PODS_ADDR
    monitor: str = MONITOR_ADDR
    gateway: str = GATEWAY_ADDR


class FaultSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    at_s: Annotated[float, msgspec.Meta(ge=0, le=1e9)]  # virtual time of the fault
    kind: Literal["npu-crash", "hang-npu", "hbm-fault", "npu-reset", "link-down", "link-up", "link-degrade",
                  "link-flap", "kill-te", "kill-te-process", "heartbeat-loss", "kill-je", "link-error"]  # fmt: skip
    target: str  # an NPU (hw/s0/npu3), a link (s0/npu3/roce), a TE (te/1) or a JE (je/0)
    bw_factor: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None  # link-degrade (default 0.5)
    region: str | None = None  # hbm-fault: an HBM region the TEs use (default kv)
    down_s: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None  # link-flap
    up_s: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None  # link-flap
    count: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None  # link-flap (default 1)
    duration_s: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None  # heartbeat-loss
    span: tuple[float, float] | None = None  # hbm-fault: the faulty part [lo, hi) of the region (fractions)


def check_faults(faults: tuple[FaultSpec, ...], topology: str, servers: int, tes: Sequence[str] | None = None,
                 jes: Sequence[str] | None = None) -> list[tuple[str, str]]:  # fmt: skip
    """(dotted key, problem) for each fault that cannot apply to this cluster. `tes` / `jes`:
    the cluster's TE and JE addresses (None: any te/N, je/N)."""
    from deepserve.adapters.hardware.devices.topology import build

    if len(faults) > MAX_FAULTS:
        return [("faults", f"at most {MAX_FAULTS} faults, got {len(faults)}")]
    topo = build(topology, servers)
    npus, links = set(topo.npus()), {link.name for link in topo.links}
    problems: list[tuple[str, str]] = []
    for i, f in enumerate(faults):
        key = f"faults.{i}"
        if f.kind in NPU_KINDS and f.target not in npus:
            problems.append((f"{key}.target", f"no NPU {f.target!r} in this cluster (e.g. {min(npus)})"))
        if f.kind in LINK_KINDS and f.target not in links:
            problems.append((f"{key}.target", f"no link {f.target!r} in the {topology} topology "
                                              f"(e.g. {sorted(links)[0]})"))  # fmt: skip
        for name, kinds in (("bw_factor", ("link-degrade",)), ("region", ("hbm-fault",)), ("span", ("hbm-fault",)),
                            *((n, ("link-flap",)) for n in FLAP_FIELDS)):  # fmt: skip
            if getattr(f, name) is not None and f.kind not in kinds:
                problems.append((f"{key}.{name}", f"only for {kinds[0]}, not {f.kind}"))
        problems += _check_target(f, key, "TE", TE_KINDS, _TE, tes)
        problems += _check_target(f, key, "JE", JE_KINDS, _JE, jes)
        if f.duration_s is not None and f.kind != "heartbeat-loss":
            problems.append((f"{key}.duration_s", f"only for heartbeat-loss, not {f.kind}"))
        if f.kind == "heartbeat-loss" and f.duration_s is None:
            problems.append((f"{key}.duration_s", "required for heartbeat-loss"))
        if f.kind == "link-flap" and (f.down_s is None or f.up_s is None):
            problems.append((f"{key}.{'down_s' if f.down_s is None else 'up_s'}", "required for link-flap"))
        if f.span is not None and not 0 <= f.span[0] < f.span[1] <= 1:
            problems.append((f"{key}.span", f"must be [lo, hi] with 0 <= lo < hi <= 1, got {list(f.span)}"))
        if f.region is not None and f.region not in DEFAULT_REGIONS:
            problems.append((f"{key}.region", f"the TEs use HBM regions {', '.join(DEFAULT_REGIONS)}; "
                                              f"got {f.region!r}"))  # fmt: skip
    return problems


def _check_target(f: FaultSpec, key: str, what: str, kinds: tuple[str, ...], form: re.Pattern[str],
                  names: Sequence[str] | None) -> list[tuple[str, str]]:  # fmt: skip
    if f.kind not in kinds:
        return []
    if names is not None and f.target not in names:
        known = ", ".join(sorted(names)[:4]) or "none"
        return [(f"{key}.target", f"no {what} {f.target!r} in this cluster ({known}{', ...' if len(names) > 4 else ''})")]
    if names is None and not form.fullmatch(f.target):
        return [(f"{key}.target", f"{f.kind} targets a {what} ({what.lower()}/N), got {f.target!r}")]
    return []


def fault_inputs(faults: tuple[FaultSpec, ...], servers: tuple[int, ...] | None = None,
                 wiring: Wiring | None = None) -> list[tuple[float, str, Any]]:  # fmt: skip
    """(time, address, message) of each fault, in plan order (a `kill-je` is two: the JE's stop
    and the gateway's notice); with `servers`, only the hardware faults on them (a split
    simulation's worker holds its servers' NPUs and links alone, and no control plane)."""
    w = wiring or Wiring()
    out: list[tuple[float, str, Any]] = []
    for f in faults:
        hardware = f.kind in NPU_KINDS or f.kind in LINK_KINDS
        if servers is not None and not (hardware and server_of(f.target) in servers):
            continue
        why = f"scenario fault at {f.at_s:g} s: {f.kind} {f.target}"
        if f.kind in NPU_KINDS:
            out.append((f.at_s, f.target, _message(f)))
        elif f.kind in LINK_KINDS:
            out.append((f.at_s, FABRIC, _message(f)))
        elif f.kind in ("kill-te", "kill-te-process"):
            out.append((f.at_s, w.pods, KillPod(te=f.target, reason=why, exited=f.kind == "kill-te-process")))
        elif f.kind == "heartbeat-loss":
            out.append((f.at_s, w.monitor, LoseHeartbeats(te=f.target, duration_s=f.duration_s or 0.0)))
        else:  # kill-je
            out.append((f.at_s, f.target, Stop(by=FAULT_SRC)))
            out.append((f.at_s, w.gateway, JeLost(je=f.target, reason=why)))
    return out


def server_of(target: str) -> int:
    """The server an NPU ("hw/s3/npu1") or a link ("s3/npu1/roce", "s3/hccs/0-1") is on."""
    head = target.removeprefix("hw/").split("/", 1)[0]
    assert head.startswith("s") and head[1:].isdigit(), target
    return int(head[1:])


def _message(f: FaultSpec) -> Message:
    why = f"scenario fault at {f.at_s:g} s"
    made: dict[str, Any] = {
        "npu-crash": lambda: NpuCrash(reason=why),
        "hang-npu": lambda: NpuHang(reason=why),
        "hbm-fault": lambda: HbmRegionFault(region=f.region or "kv", span=f.span or ()),
        "link-error": lambda: NpuLinkError(reason=why),
        "npu-reset": lambda: NpuReset(repair=True),
        "link-down": lambda: LinkDown(link=f.target),
        "link-up": lambda: LinkUp(link=f.target),
        "link-degrade": lambda: LinkDegrade(link=f.target, bw_factor=0.5 if f.bw_factor is None else f.bw_factor),
        "link-flap": lambda: LinkFlap(link=f.target, down_s=f.down_s or 0.0, up_s=f.up_s or 0.0, count=f.count or 1),
    }
    return made[f.kind]()  # type: ignore[no-any-return]
