"""A scenario's fault plan (`[[faults]]`): hardware faults at virtual times, so an SRE can run an
incident as a simulation from the CLI, with `deepserve fault`'s kinds and names.

    [[faults]]
    at_s = 30.0
    kind = "link-down"
    target = "s0/npu0/roce"

Each fault becomes an external input at its time (to the NPU, or to the fabric for a link), so it
is logged and replay re-injects it. Data and checks here; `run.py` injects them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from deepserve.actors.ports.faults import (
    HbmRegionFault,
    LinkDegrade,
    LinkDown,
    LinkFlap,
    LinkUp,
    NpuCrash,
    NpuHang,
    NpuReset,
)
from deepserve.actors.ports.npu import DEFAULT_REGIONS
from deepserve.core import Message

NPU_KINDS = ("npu-crash", "hang-npu", "hbm-fault", "npu-reset")
LINK_KINDS = ("link-down", "link-up", "link-degrade", "link-flap")
FLAP_FIELDS = ("down_s", "up_s", "count")
MAX_FAULTS = 10_000
FABRIC = "hw/fabric"


class FaultSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    at_s: Annotated[float, msgspec.Meta(ge=0, le=1e9)]  # virtual time of the fault
    kind: Literal["npu-crash", "hang-npu", "hbm-fault", "npu-reset", "link-down", "link-up", "link-degrade",
                  "link-flap"]  # fmt: skip
    target: str  # an NPU (hw/s0/npu3) or a link (s0/npu3/roce)
    bw_factor: Annotated[float, msgspec.Meta(gt=0, le=1)] | None = None  # link-degrade (default 0.5)
    region: str | None = None  # hbm-fault: an HBM region the TEs use (default kv)
    down_s: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None  # link-flap
    up_s: Annotated[float, msgspec.Meta(gt=0, le=1e6)] | None = None  # link-flap
    count: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None  # link-flap (default 1)


def check_faults(faults: tuple[FaultSpec, ...], topology: str, servers: int) -> list[tuple[str, str]]:
    """(dotted key, problem) for each fault that cannot apply to this cluster."""
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
        for name, kinds in (("bw_factor", ("link-degrade",)), ("region", ("hbm-fault",)),
                            *((n, ("link-flap",)) for n in FLAP_FIELDS)):  # fmt: skip
            if getattr(f, name) is not None and f.kind not in kinds:
                problems.append((f"{key}.{name}", f"only for {kinds[0]}, not {f.kind}"))
        if f.kind == "link-flap" and (f.down_s is None or f.up_s is None):
            problems.append((f"{key}.{'down_s' if f.down_s is None else 'up_s'}", "required for link-flap"))
        if f.region is not None and f.region not in DEFAULT_REGIONS:
            problems.append((f"{key}.region", f"the TEs use HBM regions {', '.join(DEFAULT_REGIONS)}; "
                                              f"got {f.region!r}"))  # fmt: skip
    return problems


def fault_inputs(faults: tuple[FaultSpec, ...], servers: tuple[int, ...] | None = None) -> list[tuple[float, str, Any]]:
    """(time, address, message) of each fault, in plan order; with `servers`, only those on
    them (a split simulation's worker holds its servers' NPUs and links alone)."""
    return [(f.at_s, f.target if f.kind in NPU_KINDS else FABRIC, _message(f)) for f in faults
            if servers is None or server_of(f.target) in servers]  # fmt: skip


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
        "hbm-fault": lambda: HbmRegionFault(region=f.region or "kv"),
        "npu-reset": lambda: NpuReset(),
        "link-down": lambda: LinkDown(link=f.target),
        "link-up": lambda: LinkUp(link=f.target),
        "link-degrade": lambda: LinkDegrade(link=f.target, bw_factor=0.5 if f.bw_factor is None else f.bw_factor),
        "link-flap": lambda: LinkFlap(link=f.target, down_s=f.down_s or 0.0, up_s=f.up_s or 0.0, count=f.count or 1),
    }
    return made[f.kind]()  # type: ignore[no-any-return]
