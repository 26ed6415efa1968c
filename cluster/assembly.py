"""The one assembly (issue 31 §1): a config's cluster spawned into a driver — the emulated
topology, the control plane (cluster manager, heartbeat monitor when on, the in-process pod
launcher, which boots every TE group's TEs and each replacement), `scheduling.jes` JEs and the
gateway. `deepserve sim` hands it a `SimDriver` and feeds the gateway a trace; `deepserve up` an
`AsyncDriver` and an HTTP frontend. Nothing else differs.

`build_cluster` is the same assembly for a scenario run without the platform's front
(`scheduling.entry = "dispatcher"`, `deepserve sim --workers N`, the policy benchmarks): the same
topology and TEs (te.py), and in front of them either the workload stand-in's round robin (no JE
nor control plane: a run ends when its last request does) or, for a scenario with a
`[scheduling]` section, JEs behind a gateway at the workload's address with the issue-6 cluster
manager (`CM_ADDR`: membership only, no pods nor heartbeats).

Every request enters as the gateway's `ApiRequest` (both commands): the gateway draws a JE,
the JE a TE; the answer, one `RequestDone` (or the gateway's `Refused`), goes to the request's
`reply_to` outside. A live frontend also gets every forward pass's tokens straight from the DP
master (`stream_to`, xDeepServe §4.2's output short-circuit); so does a simulation (`cluster/sim.py`
passes `ext/stream`), which reads the request's timings from its one `RequestDone`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.ports.pod import TeSlot
from deepserve.adapters.hardware.devices.topology import build, spawn_topology
from deepserve.adapters.scenario.placement import Placement, place
from deepserve.adapters.scenario.sched import Scheduling, load_heatmap, load_predictor
from deepserve.adapters.scenario.schema import Scenario

from .autoscale import AUTOSCALER_ADDR, pushed_to, spawn_autoscaler
from .control import MANAGER_ADDR, MONITOR_ADDR, PODS_ADDR, spawn_control_plane
from .health import kv_link_routing, spawn_health
from .layout import Layout, plan
from .migration_costs import kv_migration_config, migration_config
from .schema import PlatformConfig
from .te import spawn_te

GATEWAY_ADDR = "gateway"
WORKLOAD_ADDR = "workload"  # the dispatcher variant's entry (the workload stand-in)
CM_ADDR = "cm"  # the scheduling variant's cluster manager (actors/je/cluster.py)
__all__ = ["CM_ADDR", "GATEWAY_ADDR", "MANAGER_ADDR", "MONITOR_ADDR", "PODS_ADDR", "WORKLOAD_ADDR", "Built",
           "assemble", "build_cluster", "je_addrs", "je_config"]  # fmt: skip


class Built(msgspec.Struct, frozen=True):
    """What `assemble` spawned: where requests enter, the JEs, the layout of every TE slot."""

    layout: Layout
    gateway: str
    jes: tuple[str, ...]
    heartbeats: bool

    @property
    def slots(self) -> tuple[TeSlot, ...]:
        return self.layout.slots


def je_addrs(cfg: PlatformConfig) -> tuple[str, ...]:
    return tuple(f"je/{k}" for k in range(cfg.scheduling.jes))


def spawn_front(driver: Any, cfg: PlatformConfig, *, gateway: str = GATEWAY_ADDR, stream_to: str = "",
                max_inflight: int | None = None, wake_heartbeats: bool = False,
                forced: dict[str, str] | None = None) -> tuple[str, ...]:  # fmt: skip
    """The JEs (each with its own view of load; membership and KV events come to each) and the
    gateway, which spreads jobs over them. Returns the JEs' addresses. `wake_heartbeats`: the
    gateway wakes a monitor backed off while idle (`assemble`'s runs; the daemon's frontend
    still sends its own wake, daemon/runtime.py `_wake_heartbeats`)."""
    from deepserve.actors.gateway.actor import Gateway
    from deepserve.actors.je.actor import JobExecutor

    jes = je_addrs(cfg)
    je = {**je_config(cfg.scheduling, cfg.cluster.kv_block_tokens), "stream_to": stream_to}
    mig = cfg.scheduling.migration
    if mig.enabled:  # only then: a config without it spawns its JEs exactly as before
        je["migration"] = {**migration_config(cfg.cluster, mig.enabled, mig.max_migrations),
                           "ask_stream_s": mig.ask_stream_s}  # fmt: skip
        if mig.kv:  # KV migration from a failed TE's host DRAM (actors/flowserve/distflow/migrate.py)
            je["migration"].update(kv_migration_config(cfg.cluster))
            if mig.live:  # live migration of a draining TE's streams
                je["migration"]["live"] = True
    a = cfg.autoscale
    if a.enabled and a.min_tes == 0 and not a.advisory:  # a model scaled to zero comes back on demand
        je["park_empty"] = True
    if cfg.recovery.rung == "restart-world":  # every TE of the world restarts: a job waits for one
        je["park_empty"] = True
    if kv_link_routing(cfg) > 0:  # issue 33: link probing's verdicts, not a blind cool-down (kvlinks.py)
        je["kv_fail_cooldown_s"] = 0.0
    if forced:  # a what-if's fork at a decision (replay/whatif.py): task id -> TE
        je["forced"] = dict(forced)
    for addr in jes:
        driver.spawn(addr, JobExecutor, config=je)
    limit = max_inflight if max_inflight is not None else cfg.scheduling.max_inflight_per_model
    # the manager: told of a lost JE, it has the TEs cancel that JE's tasks
    gw: dict[str, Any] = {"jes": list(jes), "max_inflight_per_model": limit, "manager": MANAGER_ADDR}
    c = cfg.control
    if wake_heartbeats and c.heartbeats and c.heartbeat_idle_max_interval_s > 0:
        # a request after a quiet spell wakes a monitor backed off while idle: one message a
        # spell, none under load (actors/gateway/actor.py `wake`)
        gw.update(wake=MONITOR_ADDR, wake_after_s=c.heartbeat_interval_s)
    if cfg.autoscale.enabled:  # the autoscaler hears of each request and its answer
        gw["observer"] = AUTOSCALER_ADDR
    if cfg.scheduling.migration.enabled:  # a lost JE's streams move to another JE, which resumes them
        gw["migrate_streams"] = True
    driver.spawn(gateway, Gateway, config=gw)
    return jes


def spawn_control(driver: Any, cfg: PlatformConfig, layout: Layout, jes: tuple[str, ...], *,
                  in_process_pods: bool = True) -> None:  # fmt: skip
    """The control plane; the manager launches each group's initial TEs (resident: at once)."""
    spares = tuple(range(layout.servers, layout.servers + cfg.recovery.spare_servers))
    # the autoscaler takes the membership pushes the JEs take (the manager pushes to each)
    spawn_control_plane(driver, layout.slots, layout.groups, pushed_to(cfg, jes), cfg.control,
                        in_process_pods=in_process_pods, recovery=cfg.recovery, spare_servers=spares,
                        scaling=cfg.scaling, topology=cfg.cluster.topology,
                        kv_link_routing=kv_link_routing(cfg) > 0)  # fmt: skip
    if cfg.autoscale.enabled:
        spawn_autoscaler(driver, cfg, layout.slots, layout.groups)


def assemble(driver: Any, cfg: PlatformConfig, *, gateway: str = GATEWAY_ADDR, stream_to: str = "",
             max_inflight: int | None = None, forced: dict[str, str] | None = None) -> Built:  # fmt: skip
    """Spawn `cfg`'s whole cluster into `driver` (cfg as `config.for_driver` made it)."""
    layout = plan(cfg)
    c = cfg.cluster
    # the recovery ladder's spare pool: empty servers beyond the layout (none by default)
    servers = layout.servers + cfg.recovery.spare_servers
    spawn_topology(driver, build(c.topology, servers), variance=c.npu_variance)
    spawn_health(driver, cfg, layout.servers)  # cluster.resilience.device_health (off: nothing)
    jes = spawn_front(driver, cfg, gateway=gateway, stream_to=stream_to, max_inflight=max_inflight,
                     wake_heartbeats=True, forced=forced)  # fmt: skip
    spawn_control(driver, cfg, layout, jes)
    return Built(layout, gateway, jes, cfg.control.heartbeats)


def je_config(sch: Scheduling, kv_block_tokens: int = 128) -> dict[str, Any]:
    """A JE's configuration from the `[scheduling]` section (its heatmap and predictor read)."""
    return {
        "kv_block_tokens": kv_block_tokens,
        "policy": sch.policy, "params": dict(sch.params),
        "heatmap": load_heatmap(sch.heatmap) if sch.heatmap else None,
        "forwarding": msgspec.to_builtins(sch.forwarding), "max_attempts": sch.max_attempts,
        "kv_fail_cooldown_s": sch.kv_fail_cooldown_s, "kv_events": sch.kv_events,
        "predictor": load_predictor(sch.predictor) if sch.predictor else None,
        "quiet_accept": True,  # no TaskAccepted for direct chat tasks (JeConfig.quiet_accept)
        "release_lost_decode_kv": True,  # a failed decode's P-side KV freed at once (zombie protection)
    }  # fmt: skip


def build_cluster(driver: Any, scenario: Scenario) -> Placement:
    """The dispatcher variant (module docstring): the hardware, every TE of the scenario and what
    feeds them at `WORKLOAD_ADDR`; returns the placement."""
    c = scenario.cluster
    placement = place(c)
    spawn_topology(driver, build(c.topology, placement.servers), variance=c.npu_variance)
    if scenario.scheduling is not None:  # issue 6: gateway + JEs at the workload's address
        spawn_scheduling(driver, scenario, placement, WORKLOAD_ADDR)
    for te in placement.tes:
        spawn_te(driver, scenario, te)
    if scenario.scheduling is None:
        spawn_workload(driver, scenario, placement, direct=c.dp_groups == 1)
    else:
        announce_tes(driver, scenario, placement)
    return placement


def spawn_workload(driver: Any, scenario: Scenario, placement: Placement, direct: bool = False) -> str:
    """The workload actor, submitting to the TEs' shells; with `direct` (TEs of one DP group,
    whose shell only forwards a task to `{te}/dp/0`, no balancing round) straight to that DP
    master: one delivery a request less, the same master, the same task."""
    from deepserve.actors.workload.actor import Workload

    def entry(role: str) -> list[str]:
        return [f"{te}/dp/0" if direct else te for te in placement.role(role)]

    return driver.spawn(  # type: ignore[no-any-return]
        WORKLOAD_ADDR, Workload, mode=scenario.cluster.mode, tes=entry("colocated"),
        prefill_tes=entry("prefill"), decode_tes=entry("decode"),
        stream=False,  # the run reads timings from TaskFinished: no per-pass TaskTokens
    )  # fmt: skip


def spawn_scheduling(driver: Any, scenario: Scenario, placement: Placement, gateway_addr: str) -> None:
    """The issue-6 cluster manager, the JEs and the gateway (the TEs are spawned by the caller)."""
    from deepserve.actors.gateway.actor import Gateway
    from deepserve.actors.je.actor import JobExecutor
    from deepserve.actors.je.cluster import ClusterManager

    sch = scenario.scheduling
    assert sch is not None
    jes = [f"je/{k}" for k in range(sch.jes)]
    driver.spawn(CM_ADDR, ClusterManager, jes=jes)
    for je in jes:
        driver.spawn(je, JobExecutor, config=je_config(sch, scenario.cluster.kv_block_tokens))
    driver.spawn(gateway_addr, Gateway, config={"jes": jes, "max_inflight_per_model": sch.max_inflight_per_model})


def announce_tes(driver: Any, scenario: Scenario, placement: Placement) -> None:
    """Each TE's `RegisterTe` to the cluster manager at t=0 — what a TE shell configured with a
    cluster manager sends on start. Injected here instead, because such a shell also reports
    load on a timer forever, which the JE does not use (its load signal is its own open-task
    count) and which would keep the simulated clock running after the last request."""
    from deepserve.actors.flowserve.messages import RegisterTe

    c = scenario.cluster
    for te in placement.tes:
        driver.inject(CM_ADDR, RegisterTe(te=te.addr, model=c.model, role=te.role, dp_groups=c.dp_groups,  # type: ignore[arg-type]
                                          npus=te.npus), at=0.0, src="ext/builder")  # fmt: skip
