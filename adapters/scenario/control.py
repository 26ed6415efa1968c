"""The control plane's settings (the `[control]` section of a config, issue 7 §2): data only.
The wiring that spawns the control plane from them is deepserve/cluster/control.py.
"""

from __future__ import annotations

import msgspec


class ControlPlane(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The control plane's settings (the daemon's `[control]` section)."""

    heartbeats: bool = True
    heartbeat_interval_s: float = 1.0  # control plane → TE shell (xDeepServe §6.1)
    heartbeat_misses: int = 3  # in a row, then the TE is declared failed
    heartbeat_timeout_s: float = 0.0  # TE shell → DP masters ask timeout; 0: half the interval
    # idle backoff: quiet rounds double the interval up to this (0: off; actors/cluster/heartbeat.py)
    heartbeat_idle_max_interval_s: float = 0.0
    # leases: a TE whose devices promised word of any fault is not asked for this long (0: off;
    # actors/cluster/heartbeat.py)
    heartbeat_lease_s: float = 0.0
    # each TE's heartbeat responder watches its NPUs through a lease: a crashed device under an
    # idle TE is declared within one interval (actors/cluster/responder.py; off: as before)
    heartbeat_device_watch: bool = False
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
        lease = self.heartbeat_lease_s
        if lease and not self.heartbeat_interval_s <= lease <= 86_400:
            raise ValueError(f"heartbeat_lease_s: must be 0 (off) or in [heartbeat_interval_s, 86400], got {lease}")
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
