"""The control plane's wiring (issue 7 §2): the cluster manager, the heartbeat monitor and the
in-process pod launcher spawned in a driver, from the config's `[control]` settings
(adapters/scenario/control.py) and the TE slots (te.py). The assembly (assembly.py) and the
daemon's process mode (daemon/procs/runtime.py) call it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.ports.pod import TeSlot
from deepserve.adapters.scenario.control import ControlPlane

MANAGER_ADDR = "cluster"
MONITOR_ADDR = "cluster/heartbeat"
PODS_ADDR = "pods"


def spawn_control_plane(driver: Any, slots: tuple[TeSlot, ...], groups: dict[str, int], jes: list[str],
                        control: ControlPlane, directory_subscribers: tuple[str, ...] = (),
                        pods_addr: str = PODS_ADDR, in_process_pods: bool = True, recovery: Any = None,
                        spare_servers: tuple[int, ...] = ()) -> None:  # fmt: skip
    """The pod launcher (in-process unless another launcher serves `pods_addr`, e.g. processes
    mode's supervisor), the heartbeat monitor (when on) and the cluster manager, which launches
    each group's first `groups[g]` slots as resident TEs at once. `recovery`: the `[recovery]`
    section (actors/cluster/ladder.py), `spare_servers` its spare pool's servers."""
    from deepserve.actors.cluster.heartbeat import HeartbeatMonitor
    from deepserve.actors.cluster.manager import ClusterManager
    from deepserve.actors.cluster.pods import InProcessPods

    if in_process_pods:
        driver.spawn(pods_addr, InProcessPods, config={"pod_start_s": control.pod_start_s,
                                                       "te_preload_s": control.te_preload_s})  # fmt: skip
    if control.heartbeats:
        driver.spawn(MONITOR_ADDR, HeartbeatMonitor, config={
            "manager": MANAGER_ADDR, "interval_s": control.heartbeat_interval_s,
            "misses": control.heartbeat_misses, "idle_max_interval_s": control.heartbeat_idle_max_interval_s,
            "lease_s": control.heartbeat_lease_s})  # fmt: skip
    extra: dict[str, Any] = {}
    if recovery is not None and recovery.rung != "replace":  # the default: the config as before
        extra = {"recovery": msgspec.to_builtins(recovery), "spare_servers": list(spare_servers)}
    driver.spawn(MANAGER_ADDR, ClusterManager, config={**extra,
        "jes": jes, "pods": pods_addr, "monitor": MONITOR_ADDR if control.heartbeats else "",
        "slots": [msgspec.to_builtins(s) for s in slots], "groups": groups,
        "heartbeat_timeout_s": control.ask_timeout_s() if control.heartbeats else 0.0,
        "directory_subscribers": list(directory_subscribers),
        "drain_timeout_s": control.drain_timeout_s, "boot_timeout_s": control.boot_timeout_s,
    })  # fmt: skip
