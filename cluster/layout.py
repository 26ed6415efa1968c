"""Where every TE group of a config goes — a pure function of the config.

Groups are placed in config order (`[cluster]`, `[pd]`, `[[groups]]`), each packed as a scenario
places its TEs (adapters/scenario/placement.py), on the servers after the previous group's: a
group's TEs never share a server with another group's, so a fault plan names servers per group.
TEs are numbered on across groups (`te/0`, `te/1`, ...). The first group, when colocated, gets
`control.spare_tes` slots beyond its TEs (capacity `deepserve scale` may use; never launched at
start). Each slot carries its TE's full configuration (priced by the performance model), which
the cluster manager hands to the pod launcher for the first boot and every replacement.
"""

from __future__ import annotations

import msgspec

from deepserve.actors.ports.pod import TeSlot
from deepserve.adapters.scenario.placement import Placement, TePlacement, place
from deepserve.adapters.scenario.schema import Scenario

from .schema import PlatformConfig, roles
from .te import te_slot


class Layout(msgspec.Struct, frozen=True):
    placement: Placement  # every TE slot of every group, spare ones included
    slots: tuple[TeSlot, ...]  # one per placed TE, in the same order
    groups: dict[str, int]  # "{model}/{role}" -> TEs launched at start
    scenario_of: dict[str, str]  # TE address -> its group's config key (cluster, pd, groups.N)

    @property
    def servers(self) -> int:
        return self.placement.servers


def _shifted(te: TePlacement, addr: str, base: int) -> TePlacement:
    npus = tuple(a.replace(f"hw/s{te.server}/", f"hw/s{te.server + base}/", 1) for a in te.npus)
    return msgspec.structs.replace(te, addr=addr, server=te.server + base, npus=npus)


def plan(cfg: PlatformConfig) -> Layout:
    tes: list[TePlacement] = []
    slots: list[TeSlot] = []
    groups: dict[str, int] = {}
    scenario_of: dict[str, str] = {}
    servers = 0
    for key, scenario in cfg.group_scenarios():
        c = scenario.cluster
        placed_c = c
        if key == "cluster" and c.mode == "colocated" and cfg.control.spare_tes:
            placed_c = msgspec.structs.replace(c, tes=c.tes + cfg.control.spare_tes)
        own = place(placed_c)
        sized = Scenario(name=scenario.name, seed=scenario.seed, cluster=c)
        for te in own.tes:
            moved = _shifted(te, f"te/{len(tes)}", servers)
            tes.append(moved)
            slots.append(te_slot(sized, moved))
            scenario_of[moved.addr] = key
        for role in roles(c):
            groups[f"{c.model}/{role}"] = {"colocated": c.tes, "prefill": c.prefill_tes, "decode": c.decode_tes}[role]
        servers += own.servers
    return Layout(Placement(servers, tuple(tes)), tuple(slots), groups, scenario_of)
