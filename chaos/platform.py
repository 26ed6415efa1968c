"""The cluster a chaos seed runs: the scenario's TEs launched by the control plane (cluster
manager, heartbeat monitor, in-process pods), a gateway at the workload's address and the JEs —
the daemon's wiring (daemon/runtime.py), in a SimDriver. The DP masters stream output tokens
to `STREAM_ADDR` (the output short-circuit), where the token checker reads them.

(p-platform is making `deepserve sim` assemble exactly this from one config; until that lands
the wiring is spelled out here, on the same pieces: adapters/scenario/{control,sched}.py.)
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.gateway.actor import Gateway
from deepserve.actors.je.actor import JobExecutor
from deepserve.adapters.hardware.devices.topology import build, spawn_topology
from deepserve.adapters.scenario.builder import WORKLOAD_ADDR
from deepserve.adapters.scenario.control import ControlPlane, spawn_control_plane, te_slot
from deepserve.adapters.scenario.placement import Placement, place
from deepserve.adapters.scenario.sched import Scheduling, je_config
from deepserve.adapters.scenario.schema import Scenario

STREAM_ADDR = "ext/stream"
# Fast detection and boots keep a seed's virtual time (and its wall time) short; the ratios are
# the daemon's (3 misses; a boot a few heartbeat intervals). A pod killed while it boots is found
# only by the boot timeout (no heartbeats yet): 30 s here (a simulated boot takes ~6 s), not the
# daemon's 120 s, so the settle time after the faults (runner.SETTLE_S) can cover it.
CONTROL = ControlPlane(heartbeat_interval_s=0.5, heartbeat_misses=3, pod_start_s=1.0, te_preload_s=1.0,
                       boot_timeout_s=30.0, spare_tes=0)  # fmt: skip


def groups_of(scenario: Scenario) -> dict[str, int]:
    """Each TE group's target size (`model/role` -> TEs)."""
    c = scenario.cluster
    if c.mode == "colocated":
        return {f"{c.model}/colocated": c.tes}
    return {f"{c.model}/prefill": c.prefill_tes, f"{c.model}/decode": c.decode_tes}


def jes_of(scenario: Scenario) -> list[str]:
    sch = scenario.scheduling or Scheduling()
    return [f"je/{k}" for k in range(sch.jes)]


def build_platform(driver: Any, scenario: Scenario, control: ControlPlane = CONTROL) -> Placement:
    """Spawn the hardware, the JEs, the gateway and the control plane, which launches the TEs."""
    c = scenario.cluster
    placement = place(c)
    spawn_topology(driver, build(c.topology, placement.servers), variance=c.npu_variance)
    sch = scenario.scheduling or Scheduling()
    jes = jes_of(scenario)
    cfg = {**je_config(sch, c.kv_block_tokens), "stream_to": STREAM_ADDR}
    for je in jes:
        driver.spawn(je, JobExecutor, config=cfg)
    driver.spawn(WORKLOAD_ADDR, Gateway, config={"jes": jes, "max_inflight_per_model": sch.max_inflight_per_model})
    slots = tuple(te_slot(scenario, te) for te in placement.tes)
    spawn_control_plane(driver, slots, groups_of(scenario), jes, control)
    return placement


def with_seed(scenario: Scenario, seed: int, requests: int | None) -> Scenario:
    """The scenario a chaos seed runs: its own run seed, its faults drawn apart (schedule.py),
    and its DP masters stepping every pass, as the daemon's do. (The simulator's aggregated
    decode runs, `scheduler.aggregate`, hold a master for a whole run of passes: it answers no
    heartbeat meanwhile and healthy TEs are declared failed — reported, issue 31.)"""
    w = scenario.workload
    if requests is not None:
        w = msgspec.structs.replace(w, requests=requests)
    c = scenario.cluster
    c = msgspec.structs.replace(c, scheduler=msgspec.structs.replace(c.scheduler, aggregate=False))
    return msgspec.structs.replace(scenario, seed=seed, workload=w, cluster=c, faults=())
