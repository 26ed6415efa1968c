"""`cluster.resilience`: fine-grained fault handling of a TE group (xDeepServe §6.1-6.2), every
setting off by default — a config without this section behaves, and logs, as before.

    [cluster.resilience]
    token_recompute = true   # a transient link error rolls every DP group back one iteration
    hbm_masking = true       # a faulty part of the KV region is masked; its requests alone fail
    kv_link_probe_s = 2.0    # probe a failed KV transfer's path with a dummy payload (0: off)
    device_health = true     # a device-health monitor per server (actors/cluster/health.py)
    kv_link_routing = true   # the JEs route by the probes' verdicts, not a cool-down (needs kv_link_probe_s)
    kv_backup = true         # prompt KV written through to host DRAM (survives a device fault)
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec


class Resilience(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    token_recompute: bool = False
    hbm_masking: bool = False
    # DistFlow link probing: after a failed or timed-out KV transfer, a dummy payload on the same
    # path within this many seconds tells decode-side saturation (delivered) from a link fault.
    kv_link_probe_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 0.0
    # A device-health monitor on each server (`hw/sN/health`): every NPU's condition recorded by
    # level (recoverable in place, instance, node); the KV probers report to it.
    device_health: bool = False
    # KV link routing (issue 33): the probers' verdicts drive the JEs' routing (actors/je/kvlinks.py)
    # instead of the blind cool-down; a blocked path is probed again every `kv_link_probe_s` until
    # it carries data. Spawns the per-server monitors that pass the verdicts on.
    kv_link_routing: bool = False
    # Every prompt block a DP master indexes in HBM is written through to its host's DRAM tier
    # (xLLM's multi-level KV cache): the copy a device fault leaves readable for KV migration
    kv_backup: bool = False

    def __post_init__(self) -> None:
        if self.kv_link_routing and not self.kv_link_probe_s:
            raise ValueError("kv_link_routing: needs kv_link_probe_s > 0 (the verdicts come from link probing)")


def health_addr(server: int) -> str:
    """The device-health monitor of server `server`."""
    return f"hw/s{server}/health"


def master_settings(r: Resilience, dp_groups: int, server: int) -> dict[str, Any]:
    """The DP master's config keys for `r` (none when every setting is off: the spawn config,
    logged, stays as it was)."""
    out: dict[str, Any] = {}
    if (r.device_health or r.kv_link_routing) and r.kv_link_probe_s:
        out["health_to"] = health_addr(server)
    if r.token_recompute:
        out.update(token_recompute=True, dp_groups=dp_groups)
    if r.hbm_masking:
        out["hbm_masking"] = True
    if r.kv_link_probe_s:
        out["kv_link_probe_s"] = r.kv_link_probe_s
    if r.kv_backup:
        out["kv_backup"] = True
    return out
