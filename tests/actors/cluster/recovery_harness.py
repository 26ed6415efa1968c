"""A small cluster with its control plane under SimDriver, for recovery tests: 3 colocated
Llama-3-8B TEs (1 NPU each), `jes` JEs behind the gateway, heartbeats, the in-process pod
launcher; requests enter as the HTTP layer's `ApiRequest`; a scenario's `[[faults]]` are injected
through `adapters/scenario/faults.py` exactly as a run injects them."""

from __future__ import annotations

from typing import Any

from deepserve.actors.flowserve.messages import Prompt, Sampling
from deepserve.actors.gateway.actor import Gateway
from deepserve.actors.gateway.messages import ApiRequest
from deepserve.actors.je.actor import JobExecutor
from deepserve.adapters.hardware.devices.topology import build, spawn_topology
from deepserve.adapters.scenario.control import ControlPlane
from deepserve.adapters.scenario.faults import (
    FAULT_SRC,
    FaultSpec,
    Wiring,
    check_faults,
    fault_inputs,
)
from deepserve.adapters.scenario.placement import place
from deepserve.adapters.scenario.schema import Cluster, Scenario, Scheduler
from deepserve.cluster.control import spawn_control_plane
from deepserve.cluster.te import te_slot
from deepserve.core import SimDriver
from deepserve.core.codec import decode
from deepserve.persistence.memory import MemorySink

MODEL = "llama3-8b"
GROUP = f"{MODEL}/colocated"
GATEWAY = "gw"


def build_run(faults: list[dict[str, Any]], *, seed: int = 3, jes: int = 1, requests: int = 36, gap_s: float = 0.05,
              output_tokens: int = 400, stream: bool = True, until_s: float = 45.0, interval_s: float = 0.5,
              misses: int = 3, aggregate: bool = False, idle_max_s: float = 0.0, wake: bool = False,
              again_at_s: float | None = None, lease_s: float = 0.0,
              cluster_kw: dict[str, Any] | None = None, control_kw: dict[str, Any] | None = None,
              inputs: tuple[tuple[float, str, Any], ...] = (),
              again: int | None = None) -> tuple[SimDriver, list[Any]]:  # fmt: skip
    """`again_at_s`: as many requests again from then on (or `again` many); `idle_max_s`: heartbeat idle backoff;
    `wake`: the gateway wakes the monitor when requests come back; `cluster_kw`: more of the
    cluster's settings (e.g. `resilience`, `dp_groups`); `control_kw`: more of the control plane's;
    `inputs`: (at_s, address, message) injected as an operator's inputs."""
    sched = Scheduler(max_running=4, aggregate=aggregate)
    cluster = Cluster(model=MODEL, tes=3, kv_block_tokens=16, scheduler=sched, npu_variance=False, **(cluster_kw or {}))
    scenario = Scenario(name="recovery", seed=seed, cluster=cluster)
    placement = place(cluster)
    d = SimDriver(seed, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append(env.msg)
    spawn_topology(d, build(cluster.topology, placement.servers), variance=False)
    je_addrs = [f"je/{i}" for i in range(jes)]
    for je in je_addrs:
        d.spawn(je, JobExecutor, config={"kv_block_tokens": 16})
    gw: dict[str, Any] = {"jes": je_addrs, "manager": "cluster"}  # as the assembly wires it  # as the assembly wires it
    if wake:
        gw.update(wake="cluster/heartbeat", wake_after_s=interval_s)
    d.spawn(GATEWAY, Gateway, config=gw)
    control = ControlPlane(heartbeat_interval_s=interval_s, heartbeat_misses=misses, pod_start_s=1.0, te_preload_s=2.0,
                           heartbeat_idle_max_interval_s=idle_max_s, heartbeat_lease_s=lease_s,
                           **(control_kw or {}))  # fmt: skip
    slots = tuple(te_slot(scenario, te) for te in placement.tes)
    spawn_control_plane(d, slots, {GROUP: 3}, je_addrs, control)
    specs = tuple(FaultSpec(**f) for f in faults)
    problems = check_faults(specs, cluster.topology, placement.servers, [t.addr for t in placement.tes], je_addrs)
    assert not problems, problems
    for at, dst, msg in fault_inputs(specs, wiring=Wiring(gateway=GATEWAY)):
        d.inject(dst, msg, at=at, src=FAULT_SRC)
    for at, dst, msg in inputs:
        d.inject(dst, msg, at=at)
    starts = [1.0 + gap_s * i for i in range(requests)]
    if again_at_s is not None:
        starts += [again_at_s + gap_s * i for i in range(requests if again is None else again)]
    for i, at in enumerate(starts):  # spread over the TEs by the JE's load-aware choice
        prompt = Prompt(num_tokens=256, block_hashes=tuple(1000 * i + b + 1 for b in range(16)))
        sampling = Sampling(max_tokens=output_tokens, target_output_tokens=output_tokens)
        d.inject(GATEWAY, ApiRequest(request_id=f"r{i}", model=MODEL, prompt=prompt, sampling=sampling,
                                     reply_to="ext/client", stream=stream), at=at, corr=f"r{i}")  # fmt: skip
    d.run(until=until_s)
    return d, out


def events(d: SimDriver, addr: str, cls: type) -> list[tuple[float, Any]]:
    found = []
    for step in d.sink.steps:  # type: ignore[attr-defined]
        if step.input.actor != addr:
            continue
        for ev in step.events:
            if ev.type == cls.__name__:
                found.append((step.input.t, decode(ev.type, ev.payload)))
    return found
