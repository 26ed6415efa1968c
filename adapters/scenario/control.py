"""The control plane's wiring (issue 7 §2): TE slots priced by the performance model, and the
cluster manager, heartbeat monitor and in-process pod launcher spawned in a driver.

Used by the daemon (`daemon/runtime.py`) and by simulations that ask for the control plane
(tests/actors/cluster). `deepserve sim` keeps its own wiring (sched.py): a manager without pods
or heartbeats, so its runs end when the last request does.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.ports.pod import TeSlot
from deepserve.adapters.hardware.devices.topology import host_addr

from .builder import te_config
from .placement import TePlacement
from .schema import Scenario

MANAGER_ADDR = "cluster"
MONITOR_ADDR = "cluster/heartbeat"
PODS_ADDR = "pods"


class ControlPlane(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The control plane's settings (the daemon's `[control]` section)."""

    heartbeats: bool = True
    heartbeat_interval_s: float = 1.0  # control plane → TE shell (xDeepServe §6.1)
    heartbeat_misses: int = 3  # in a row, then the TE is declared failed
    heartbeat_timeout_s: float = 0.0  # TE shell → DP masters ask timeout; 0: half the interval
    # idle backoff: quiet rounds double the interval up to this (0: off; actors/cluster/heartbeat.py)
    heartbeat_idle_max_interval_s: float = 0.0
    pod_start_s: float = 1.0  # Scaler-Pre of the in-process launcher (assumption)
    te_preload_s: float = 2.0  # TE-Pre-Load (assumption)
    drain_timeout_s: float = 60.0
    boot_timeout_s: float = 120.0  # a pod killed while booting is noticed here (no heartbeats yet)
    spare_tes: int = 1  # colocated TE slots beyond `cluster.tes`, for `deepserve scale`

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval_s <= 3600:
            raise ValueError(f"heartbeat_interval_s: must be in (0, 3600], got {self.heartbeat_interval_s}")
        if not 1 <= self.heartbeat_misses <= 1000:
            raise ValueError(f"heartbeat_misses: must be in [1, 1000], got {self.heartbeat_misses}")
        if not 0 <= self.heartbeat_timeout_s < self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s: must be >= 0 and below heartbeat_interval_s")
        idle = self.heartbeat_idle_max_interval_s
        if idle and not self.heartbeat_interval_s <= idle <= 86_400:
            raise ValueError(f"heartbeat_idle_max_interval_s: must be 0 (off) or in [heartbeat_interval_s, 86400], "
                             f"got {idle}")  # fmt: skip
        for key in ("pod_start_s", "te_preload_s"):
            if not 0 <= getattr(self, key) <= 3600:
                raise ValueError(f"{key}: must be in [0, 3600], got {getattr(self, key)}")
        if not 0 <= self.spare_tes <= 4096:
            raise ValueError(f"spare_tes: must be in [0, 4096], got {self.spare_tes}")
        for key in ("drain_timeout_s", "boot_timeout_s"):
            if not 0 < getattr(self, key) <= 86_400:
                raise ValueError(f"{key}: must be in (0, 86400], got {getattr(self, key)}")

    def ask_timeout_s(self) -> float:
        return self.heartbeat_timeout_s or self.heartbeat_interval_s / 2


def te_slot(scenario: Scenario, te: TePlacement) -> TeSlot:
    c = scenario.cluster
    return TeSlot(te=te.addr, group=f"{c.model}/{te.role}", model=c.model, role=te.role,  # type: ignore[arg-type]
                  server=te.server, host=host_addr(te.server), npus=te.npus, tp=c.tp, dp_groups=c.dp_groups,
                  te_config=te_config(scenario, te))  # fmt: skip


def spawn_control_plane(driver: Any, slots: tuple[TeSlot, ...], groups: dict[str, int], jes: list[str],
                        control: ControlPlane, directory_subscribers: tuple[str, ...] = (),
                        pods_addr: str = PODS_ADDR, in_process_pods: bool = True) -> None:  # fmt: skip
    """The pod launcher (in-process unless another launcher serves `pods_addr`, e.g. processes
    mode's supervisor), the heartbeat monitor (when on) and the cluster manager, which launches
    each group's first `groups[g]` slots as resident TEs at once."""
    from deepserve.actors.cluster.heartbeat import HeartbeatMonitor
    from deepserve.actors.cluster.manager import ClusterManager
    from deepserve.actors.cluster.pods import InProcessPods

    if in_process_pods:
        driver.spawn(pods_addr, InProcessPods, config={"pod_start_s": control.pod_start_s,
                                                       "te_preload_s": control.te_preload_s})  # fmt: skip
    if control.heartbeats:
        driver.spawn(MONITOR_ADDR, HeartbeatMonitor, config={
            "manager": MANAGER_ADDR, "interval_s": control.heartbeat_interval_s,
            "misses": control.heartbeat_misses, "idle_max_interval_s": control.heartbeat_idle_max_interval_s})  # fmt: skip
    driver.spawn(MANAGER_ADDR, ClusterManager, config={
        "jes": jes, "pods": pods_addr, "monitor": MONITOR_ADDR if control.heartbeats else "",
        "slots": [msgspec.to_builtins(s) for s in slots], "groups": groups,
        "heartbeat_timeout_s": control.ask_timeout_s() if control.heartbeats else 0.0,
        "directory_subscribers": list(directory_subscribers),
        "drain_timeout_s": control.drain_timeout_s, "boot_timeout_s": control.boot_timeout_s,
    })  # fmt: skip
