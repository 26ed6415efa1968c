"""A seed's fault schedule: which faults, on what, when — drawn from the seed alone.

Every fault kind a scenario can schedule (`adapters/scenario/faults.py`) is drawn, on the NPUs
and links the cluster's TEs use, its TEs and JEs: crashes, hangs and HBM faults (sometimes reset
later), link downs (always brought back up), degradations, flaps, pod kills, TE process kills,
heartbeat losses, and JE kills (only of a JE beyond the first: a cluster with one JE has nothing
left to recover with); several on one target at once now and then (overlapping faults). Faults fall in `[0, window_s)` after the cluster is ready; by `window_s`
every link is up again, so after it the checkers can ask that the cluster converge.

The draw uses `random.Random(seed)`, not an actor's `ctx.rng`: it is an input to the run (the
faults are injected as external inputs and logged), made before the run starts.
"""

from __future__ import annotations

import random
import re
from typing import Any, get_args, get_type_hints

import msgspec

from deepserve.adapters.hardware.devices.topology import build
from deepserve.adapters.scenario.faults import (
    JE_KINDS,
    LINK_KINDS,
    NPU_KINDS,
    TE_KINDS,
    FaultSpec,
    Wiring,
    fault_inputs,
)
from deepserve.adapters.scenario.placement import Placement

WINDOW_S = 30.0  # faults fall in the first WINDOW_S of virtual time after the cluster is ready
MAX_FAULTS = 6  # drawn per seed: 1..MAX_FAULTS (each may bring its own repair: a reset, a link-up)
SAME_TARGET_P = 0.3  # a fault hits an already faulted target (overlapping faults)
RESET_P = 0.5  # an NPU fault is followed by an operator's reset of that NPU
# Every fault kind of the scenario schema, by what it targets. A kind added to FaultSpec without
# a line here fails tests/chaos/test_chaos_schedule.py::test_every_fault_kind_is_drawn_on_targets_the_cluster_has.
TARGETS: dict[str, str] = {**{k: "npu" for k in NPU_KINDS}, **{k: "link" for k in LINK_KINDS},
                           **{k: "te" for k in TE_KINDS}, **{k: "je" for k in JE_KINDS}}
_NPU = re.compile(r"^s(\d+)/npu(\d+)/")
_HCCS = re.compile(r"^s(\d+)/hccs/(\d+)-(\d+)$")


def fault_kinds() -> tuple[str, ...]:
    """The kinds `FaultSpec.kind` accepts (the schema is the list, not a copy of it)."""
    return get_args(get_type_hints(FaultSpec)["kind"])


class Targets(msgspec.Struct, frozen=True):
    npus: tuple[str, ...]  # hw/sI/npuJ of every TE
    links: tuple[str, ...]  # links touching those NPUs, and their servers' host links
    tes: tuple[str, ...] = ()  # te/N
    jes: tuple[str, ...] = ()  # je/N; a JE is killed only where another one is left to serve

    def of(self, what: str) -> tuple[str, ...]:
        return {"npu": self.npus, "link": self.links, "te": self.tes, "je": self.jes[1:] if len(self.jes) > 1 else ()}[what]


def targets_of(topology: str, placement: Placement, jes: tuple[str, ...] = ()) -> Targets:
    npus = tuple(sorted({n for te in placement.tes for n in te.npus}))
    used = {(int(s), int(j)) for s, j in (re.findall(r"hw/s(\d+)/npu(\d+)", n)[0] for n in npus)}
    servers = {s for s, _ in used}
    links = []
    for link in build(topology, placement.servers).links:
        m, h = _NPU.match(link.name), _HCCS.match(link.name)
        if m is not None:
            keep = (int(m[1]), int(m[2])) in used
        elif h is not None:
            keep = (int(h[1]), int(h[2])) in used and (int(h[1]), int(h[3])) in used  # a TP group's
        else:
            keep = int(link.name.split("/", 1)[0][1:]) in servers
        if keep:
            links.append(link.name)
    return Targets(npus, tuple(links), tuple(te.addr for te in placement.tes), jes)


def draw(seed: int, targets: Targets, window_s: float = WINDOW_S, max_faults: int = MAX_FAULTS) -> tuple[FaultSpec, ...]:
    """The seed's faults, times relative to the cluster being ready, in time order."""
    rng = random.Random(seed)
    kinds = fault_kinds()
    out: list[FaultSpec] = []
    hit: dict[str, list[str]] = {what: [] for what in set(TARGETS.values())}
    for _ in range(rng.randint(1, max_faults)):
        kind = rng.choice(kinds)
        what = TARGETS[kind]
        pool = targets.of(what)
        if not pool:
            continue
        target = rng.choice(hit[what]) if hit[what] and rng.random() < SAME_TARGET_P else rng.choice(pool)
        hit[what].append(target)
        at = round(rng.uniform(0.0, 0.8 * window_s), 3)
        out += _one(rng, kind, target, at, window_s)
    return tuple(sorted(out, key=lambda f: f.at_s))


def _one(rng: random.Random, kind: str, target: str, at: float, window_s: float) -> list[FaultSpec]:
    """The fault and the repair it brings with it, if any (all before `window_s`)."""
    later = round(min(window_s - 0.001, at + rng.uniform(0.5, 10.0)), 3)
    if kind in ("npu-crash", "hang-npu", "hbm-fault"):
        region = {"region": rng.choice(("kv", "weights"))} if kind == "hbm-fault" else {}
        fault = FaultSpec(at_s=at, kind=kind, target=target, **region)  # type: ignore[arg-type]
        if rng.random() < RESET_P:
            return [fault, FaultSpec(at_s=later, kind="npu-reset", target=target)]
        return [fault]
    if kind == "link-degrade":
        bw = round(rng.uniform(0.05, 0.9), 3)
        return [FaultSpec(at_s=at, kind="link-degrade", target=target, bw_factor=bw),
                FaultSpec(at_s=later, kind="link-up", target=target)]  # fmt: skip
    if kind == "link-down":
        return [FaultSpec(at_s=at, kind="link-down", target=target), FaultSpec(at_s=later, kind="link-up", target=target)]
    if kind == "link-flap":
        down, up = round(rng.uniform(0.02, 2.0), 3), round(rng.uniform(0.02, 2.0), 3)
        room = max(1, int((window_s - at) // (down + up)))
        count = rng.randint(1, min(5, room))
        return [FaultSpec(at_s=at, kind="link-flap", target=target, down_s=down, up_s=up, count=count)]
    if kind == "heartbeat-loss":
        return [FaultSpec(at_s=at, kind="heartbeat-loss", target=target, duration_s=round(rng.uniform(0.2, 5.0), 3))]
    # npu-reset and link-up alone (an operator's action on a healthy target), and any kind whose
    # target is all it needs
    return [FaultSpec(at_s=at, kind=kind, target=target)]  # type: ignore[arg-type]


def injections(faults: tuple[FaultSpec, ...], start_s: float, gateway: str = "") -> list[tuple[float, str, Any]]:
    """(time, address, message) of each fault, `start_s` added: what the runner injects. A
    `kill-je`'s notice goes to `gateway`, where the platform put it (chaos: the workload's address)."""
    wiring = Wiring(gateway=gateway) if gateway else None
    return [(start_s + t, dst, msg) for t, dst, msg in fault_inputs(faults, wiring=wiring)]


def describe(f: FaultSpec) -> str:
    extra = {k: getattr(f, k) for k in ("bw_factor", "region", "down_s", "up_s", "count", "duration_s")
             if getattr(f, k) is not None}  # fmt: skip
    args = "".join(f" {k}={v}" for k, v in extra.items())
    return f"{f.at_s:g}s {f.kind} {f.target}{args}"
