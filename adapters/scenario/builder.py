"""The cluster builder: a scenario's topology, NPUs, fabric and TEs, spawned in a driver, plus the
workload actor that drives them."""

from __future__ import annotations

from typing import Any

from deepserve.actors.workload.actor import Workload
from deepserve.adapters.hardware.devices.topology import build, spawn_topology

from .placement import Placement, TePlacement, place
from .schema import Scenario

WORKLOAD_ADDR = "workload"


def build_cluster(driver: Any, scenario: Scenario) -> Placement:
    """Spawn the hardware, every TE of the scenario and the workload actor; returns the placement."""
    c = scenario.cluster
    placement = place(c)
    spawn_topology(driver, build(c.topology, placement.servers))
    for te in placement.tes:
        spawn_te(driver, scenario, te)
    spawn_workload(driver, scenario, placement)
    return placement


def spawn_workload(driver: Any, scenario: Scenario, placement: Placement) -> str:
    return driver.spawn(
        WORKLOAD_ADDR, Workload, mode=scenario.cluster.mode, tes=placement.role("colocated"),
        prefill_tes=placement.role("prefill"), decode_tes=placement.role("decode"),
    )  # fmt: skip


def spawn_te(driver: Any, scenario: Scenario, te: TePlacement) -> str:
    """One TE shell with its DP-group masters (fs-engine's actors), configured from the scenario."""
    from deepserve.actors.flowserve import te_shell  # lands with the engine (issue 10 §4)

    return te_shell.spawn_te(driver, scenario, te)  # type: ignore[attr-defined]
