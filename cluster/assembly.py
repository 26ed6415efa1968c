"""The one assembly (issue 31 §1): a config's cluster spawned into a driver — the emulated
topology, the control plane (cluster manager, heartbeat monitor when on, the in-process pod
launcher, which boots every TE group's TEs and each replacement), `scheduling.jes` JEs and the
gateway. `deepserve sim` hands it a `SimDriver` and feeds the gateway a trace; `deepserve up` an
`AsyncDriver` and an HTTP frontend. Nothing else differs.

Every request enters as the gateway's `ApiRequest` (both commands): the gateway draws a JE,
the JE a TE; the answer, one `RequestDone` (or the gateway's `Refused`), goes to the request's
`reply_to` outside. A live frontend also gets every forward pass's tokens straight from the DP
master (`stream_to`, xDeepServe §4.2's output short-circuit); a simulation reads the timings from
each task's `TaskFinished` and streams nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.ports.pod import TeSlot
from deepserve.adapters.hardware.devices.topology import build, spawn_topology
from deepserve.adapters.scenario.control import (
    MANAGER_ADDR,
    MONITOR_ADDR,
    PODS_ADDR,
    spawn_control_plane,
)
from deepserve.adapters.scenario.sched import je_config

from .layout import Layout, plan
from .schema import PlatformConfig

GATEWAY_ADDR = "gateway"
__all__ = ["GATEWAY_ADDR", "MANAGER_ADDR", "MONITOR_ADDR", "PODS_ADDR", "Built", "assemble", "je_addrs"]


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
                max_inflight: int | None = None) -> tuple[str, ...]:  # fmt: skip
    """The JEs (each with its own view of load; membership and KV events come to each) and the
    gateway, which spreads jobs over them. Returns the JEs' addresses."""
    from deepserve.actors.gateway.actor import Gateway
    from deepserve.actors.je.actor import JobExecutor

    jes = je_addrs(cfg)
    je = {**je_config(cfg.scheduling, cfg.cluster.kv_block_tokens), "stream_to": stream_to}
    for addr in jes:
        driver.spawn(addr, JobExecutor, config=je)
    limit = max_inflight if max_inflight is not None else cfg.scheduling.max_inflight_per_model
    driver.spawn(gateway, Gateway, config={"jes": list(jes), "max_inflight_per_model": limit})
    return jes


def spawn_control(driver: Any, cfg: PlatformConfig, layout: Layout, jes: tuple[str, ...], *,
                  in_process_pods: bool = True) -> None:  # fmt: skip
    """The control plane; the manager launches each group's initial TEs (resident: at once)."""
    spawn_control_plane(driver, layout.slots, layout.groups, list(jes), cfg.control,
                        in_process_pods=in_process_pods)  # fmt: skip


def assemble(driver: Any, cfg: PlatformConfig, *, gateway: str = GATEWAY_ADDR, stream_to: str = "",
             max_inflight: int | None = None) -> Built:  # fmt: skip
    """Spawn `cfg`'s whole cluster into `driver` (cfg as `config.for_driver` made it)."""
    layout = plan(cfg)
    c = cfg.cluster
    spawn_topology(driver, build(c.topology, layout.servers), variance=c.npu_variance)
    jes = spawn_front(driver, cfg, gateway=gateway, stream_to=stream_to, max_inflight=max_inflight)
    spawn_control(driver, cfg, layout, jes)
    return Built(layout, gateway, jes, cfg.control.heartbeats)
