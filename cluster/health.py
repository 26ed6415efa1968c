"""Spawning the per-server device-health monitors (actors/cluster/health.py) of a cluster whose
groups ask for them (`cluster.resilience.device_health`, or `kv_link_routing`, whose verdicts they
pass on to the cluster manager): one at `hw/sN/health` for every server the layout places,
watching that server's NPUs. Nothing is spawned otherwise."""

from __future__ import annotations

from typing import Any

from deepserve.actors.cluster.health import DeviceHealthMonitor
from deepserve.adapters.hardware.devices.topology import build
from deepserve.adapters.scenario.resilience import health_addr

from .control import MANAGER_ADDR
from .schema import PlatformConfig


def kv_link_routing(cfg: PlatformConfig) -> float:
    """The re-probe interval of KV link routing (`kv_link_probe_s` of a group that sets
    `resilience.kv_link_routing`; 0: off)."""
    return max((s.cluster.resilience.kv_link_probe_s for _, s in cfg.group_scenarios()
                if s.cluster.resilience.kv_link_routing), default=0.0)  # fmt: skip


def spawn_health(driver: Any, cfg: PlatformConfig, servers: int) -> tuple[str, ...]:
    """The monitors spawned (none unless a group sets `resilience.device_health` or
    `resilience.kv_link_routing`)."""
    reprobe_s = kv_link_routing(cfg)
    if not reprobe_s and not any(s.cluster.resilience.device_health for _, s in cfg.group_scenarios()):
        return ()
    npus = build(cfg.cluster.topology, servers).npus()
    routing: dict[str, Any] = {"report_to": MANAGER_ADDR, "reprobe_s": reprobe_s} if reprobe_s else {}
    if any(s.cluster.resilience.device_health for _, s in cfg.group_scenarios()):  # the manager acts on levels
        routing.update(report_to=MANAGER_ADDR, act=True)
    out = []
    for server in range(servers):
        mine = tuple(n for n in npus if n.startswith(f"hw/s{server}/"))
        if mine:
            out.append(driver.spawn(health_addr(server), DeviceHealthMonitor,
                                    config={"host": f"hw/s{server}", "npus": mine, **routing}))  # fmt: skip
    return tuple(out)
