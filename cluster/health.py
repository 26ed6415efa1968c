"""Spawning the per-server device-health monitors (actors/cluster/health.py) of a cluster whose
groups ask for them (`cluster.resilience.device_health`): one at `hw/sN/health` for every server
the layout places, watching that server's NPUs. Nothing is spawned otherwise."""

from __future__ import annotations

from typing import Any

from deepserve.actors.cluster.health import DeviceHealthMonitor
from deepserve.adapters.hardware.devices.topology import build
from deepserve.adapters.scenario.resilience import health_addr

from .schema import PlatformConfig


def spawn_health(driver: Any, cfg: PlatformConfig, servers: int) -> tuple[str, ...]:
    """The monitors spawned (none unless a group sets `resilience.device_health`)."""
    if not any(s.cluster.resilience.device_health for _, s in cfg.group_scenarios()):
        return ()
    npus = build(cfg.cluster.topology, servers).npus()
    out = []
    for server in range(servers):
        mine = tuple(n for n in npus if n.startswith(f"hw/s{server}/"))
        if mine:
            out.append(driver.spawn(health_addr(server), DeviceHealthMonitor,
                                    config={"host": f"hw/s{server}", "npus": mine}))  # fmt: skip
    return tuple(out)
