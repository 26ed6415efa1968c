"""The cluster a chaos seed runs: the one assembly (`cluster/assembly.py`, what `deepserve sim`
and `deepserve up` run) — the TE groups launched by the control plane (cluster manager,
heartbeat monitor, in-process pods), the JEs and the gateway — in a SimDriver. The gateway sits
at the workload's address, where `run_scenario` feeds it the trace's `Arrive`s (streaming
clients: a task that failed after output went out cannot be retried unseen), and the DP masters
stream each pass's tokens to `STREAM_ADDR` (the output short-circuit), where the token checker
reads them.

The config is loaded as `deepserve sim` loads it (`cluster/config.py`: a built-in scenario, a
scenario or daemon TOML file, `--set` overrides); chaos then sets what it needs: its own seed, its
own faults (the file's `[[faults]]` are replaced by the seed's), heartbeats on, request migration
on (a streamed request on a failed TE continues elsewhere: `scheduling.migration`), token ids
streamed (what the `migration` checker compares), and every DP master stepping each pass as the daemon's do (`scheduler.aggregate` off: an aggregated decode run
is one long NPU request, which a heartbeat takes for a stalled master).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from deepserve.cluster.assembly import WORKLOAD_ADDR, Built, assemble
from deepserve.cluster.config import for_driver, load
from deepserve.cluster.schema import PlatformConfig

STREAM_ADDR = "ext/stream"


def load_config(spec: str, overrides: Sequence[str] = ()) -> PlatformConfig:
    """A built-in scenario name or a TOML file, with overrides (a `ScenarioError` naming the key)."""
    return load(spec, overrides, "sim")


def chaos_config(cfg: PlatformConfig, seed: int, requests: int | None) -> PlatformConfig:
    """The config a chaos seed runs (see the module's docstring)."""
    def stepping(c: Any, **scheduler: Any) -> Any:
        return msgspec.structs.replace(c, scheduler=msgspec.structs.replace(c.scheduler, aggregate=False, **scheduler))

    w = cfg.workload if requests is None else msgspec.structs.replace(cfg.workload, requests=requests)
    cfg = msgspec.structs.replace(
        cfg, seed=seed, faults=(), workload=w, cluster=stepping(cfg.cluster), groups=tuple(map(stepping, cfg.groups)),
        control=msgspec.structs.replace(cfg.control, heartbeats=True),
        scheduling=msgspec.structs.replace(cfg.scheduling, migration=msgspec.structs.replace(
            cfg.scheduling.migration, enabled=True)),
    )  # fmt: skip
    cfg = for_driver(cfg, "sim")
    # token ids streamed (a simulation's are off): the migration checker compares a re-generated
    # token with the one the client has
    return msgspec.structs.replace(cfg, cluster=stepping(cfg.cluster, stream_token_ids=True),
                                   groups=tuple(stepping(g, stream_token_ids=True) for g in cfg.groups))  # fmt: skip


def build_platform(driver: Any, cfg: PlatformConfig) -> Built:
    """Spawn the hardware, the JEs, the gateway and the control plane, which launches the TEs."""
    return assemble(driver, cfg, gateway=WORKLOAD_ADDR, stream_to=STREAM_ADDR)


def settle_s(cfg: PlatformConfig) -> float:
    """Virtual time after the last fault for the cluster to converge: a pod killed while booting
    is found by the boot timeout alone; then detection and a replacement's boot."""
    c = cfg.control
    detect_s = c.heartbeat_misses * max(c.heartbeat_interval_s, c.heartbeat_idle_max_interval_s)
    return c.boot_timeout_s + detect_s + 30.0
