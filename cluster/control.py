"""The control plane's wiring (issue 7 §2): the cluster manager, the heartbeat monitor and the
in-process pod launcher spawned in a driver, from the config's `[control]` settings
(adapters/scenario/control.py) and the TE slots (te.py). The assembly (assembly.py) and the
daemon's process mode (daemon/procs/runtime.py) call it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.cluster.prewarm import Scaling
from deepserve.actors.ports.pod import TeSlot
from deepserve.adapters.scenario.control import ControlPlane

MANAGER_ADDR = "cluster"
MONITOR_ADDR = "cluster/heartbeat"
PODS_ADDR = "pods"
FORK_ADDR = "cluster/fork"
PRELOAD_ADDR = "cluster/preload"


def spawn_control_plane(driver: Any, slots: tuple[TeSlot, ...], groups: dict[str, int], jes: list[str],
                        control: ControlPlane, directory_subscribers: tuple[str, ...] = (),
                        pods_addr: str = PODS_ADDR, in_process_pods: bool = True, recovery: Any = None,
                        spare_servers: tuple[int, ...] = (), scaling: Scaling | None = None,
                        topology: str = "gen1", kv_link_routing: bool = False) -> None:  # fmt: skip
    """The pod launcher (in-process unless another launcher serves `pods_addr`, e.g. processes
    mode's supervisor), the heartbeat monitor (when on) and the cluster manager, which launches
    each group's first `groups[g]` slots as resident TEs at once. `recovery`: the `[recovery]`
    section (actors/cluster/ladder.py), `spare_servers` its spare pool's servers. With `scaling`
    on, also the fast-scaling pipeline (`spawn_scaling`)."""
    from deepserve.actors.cluster.heartbeat import HeartbeatMonitor
    from deepserve.actors.cluster.manager import ClusterManager
    from deepserve.actors.cluster.pods import InProcessPods

    pods: dict[str, Any] = {"pod_start_s": control.pod_start_s, "te_preload_s": control.te_preload_s}
    manager: dict[str, Any] = {}
    if scaling is not None and scaling.enabled:
        slots, extra = spawn_scaling(driver, scaling, slots, groups, topology, in_process_pods, spare_servers)
        pods.update(extra)
        if scaling.fork:  # the coordinator learns which TEs run from the pushes every JE gets
            jes = [*jes, FORK_ADDR]
        manager["replace_source"] = "fork" if scaling.fork else "dram"
    if in_process_pods:
        driver.spawn(pods_addr, InProcessPods, config=pods)
    if control.heartbeats:
        driver.spawn(MONITOR_ADDR, HeartbeatMonitor, config={
            "manager": MANAGER_ADDR, "interval_s": control.heartbeat_interval_s,
            "misses": control.heartbeat_misses, "idle_max_interval_s": control.heartbeat_idle_max_interval_s,
            "lease_s": control.heartbeat_lease_s,
            **({"device_watch": True} if control.heartbeat_device_watch else {})})  # fmt: skip
    ladder: dict[str, Any] = {}
    if kv_link_routing:  # issue 33 (actors/cluster/kvpaths.py): absent otherwise, the config as before
        manager["kv_link_routing"] = True
    if recovery is not None and recovery.rung != "replace":  # the default: the config as before
        ladder = {"recovery": msgspec.to_builtins(recovery), "spare_servers": list(spare_servers)}
    driver.spawn(MANAGER_ADDR, ClusterManager, config={**ladder,
        "jes": jes, "pods": pods_addr, "monitor": MONITOR_ADDR if control.heartbeats else "",
        "slots": [msgspec.to_builtins(s) for s in slots], "groups": groups,
        "heartbeat_timeout_s": control.ask_timeout_s() if control.heartbeats else 0.0,
        "directory_subscribers": list(directory_subscribers),
        "drain_timeout_s": control.drain_timeout_s, "boot_timeout_s": control.boot_timeout_s, **manager,
    })  # fmt: skip


def fork_links(topology: str) -> dict[str, str]:
    """The NPU-fork coordinator's links: Gen1's HCCS domain is one server, RoCE beyond; a
    CloudMatrix384's UB spans the whole SuperPod (topology.fork_link_kinds)."""
    if topology == "cm384":
        return {"domain_link": "ub", "domain": "cluster", "beyond_link": ""}
    return {"domain_link": "hccs", "domain": "server", "beyond_link": "roce"}


def spawn_scaling(driver: Any, scaling: Scaling, slots: tuple[TeSlot, ...], groups: dict[str, int], topology: str,
                  in_process_pods: bool, spare_servers: tuple[int, ...] = ()) -> tuple[tuple[TeSlot, ...], dict[str, Any]]:  # fmt: skip
    """DRAM pre-loading and the NPU-fork coordinator (actors/cluster/{preload,fork}.py); returns
    the slots in the manager's order (pre-loaded hosts first) and the pod launcher's settings."""
    from deepserve.actors.cluster.fork import NpuForker
    from deepserve.actors.cluster.preload import DramPreloader, order_slots, preload_plan

    plan = preload_plan(scaling, slots, groups)
    slots = order_slots(slots, groups, plan)
    driver.spawn(PRELOAD_ADDR, DramPreloader, plan=[list(p) for p in plan])  # later predictions: PreloadModel
    if scaling.fork:
        driver.spawn(FORK_ADDR, NpuForker, config={"slots": [msgspec.to_builtins(s) for s in slots],
                                                   "gather_s": scaling.fork_gather_s, **fork_links(topology)})  # fmt: skip
    # the recovery ladder's spare servers keep pre-warmed executors too: a substitution boots there
    extra = {"scaling": msgspec.to_builtins(scaling), "servers": sorted({s.server for s in slots} | set(spare_servers)),
             "forker": FORK_ADDR if scaling.fork else ""}  # fmt: skip
    return slots, extra if in_process_pods else {}
