"""Where the workload actor submits: a one-group TE's DP master directly (its shell would only
forward), a multi-group TE's shell (which balances across its groups)."""

from __future__ import annotations

from typing import Any

from deepserve.adapters.hardware.devices.topology import build as build_topology
from deepserve.adapters.hardware.devices.topology import spawn_topology
from deepserve.adapters.scenario.loader import load_scenario
from deepserve.adapters.scenario.placement import place
from deepserve.cluster.assembly import WORKLOAD_ADDR, build_cluster, spawn_workload
from deepserve.cluster.run import run_scenario
from deepserve.cluster.te import spawn_te
from deepserve.core import SimDriver


def _roles(*overrides: str) -> dict[str, list[str]]:
    d = SimDriver(seed=0)
    build_cluster(d, load_scenario("mooncake-16te", ["cluster.tes=2", *overrides]))
    d.run()
    return d.actor(WORKLOAD_ADDR).roles


def test_one_group_tes_take_tasks_at_their_master_several_groups_at_their_shell() -> None:
    assert _roles()["chat"] == ["te/0/dp/0", "te/1/dp/0"]
    assert _roles("cluster.dp_groups=2")["chat"] == ["te/0", "te/1"]
    pd = _roles("cluster.mode=pd")
    assert pd["prefill"] and all(a.endswith("/dp/0") for a in pd["prefill"] + pd["decode"])


def _through_shells(driver: Any, scenario: Any) -> None:
    c = scenario.cluster
    placement = place(c)
    spawn_topology(driver, build_topology(c.topology, placement.servers), variance=c.npu_variance)
    for te in placement.tes:
        spawn_te(driver, scenario, te)
    spawn_workload(driver, scenario, placement, direct=False)


def test_direct_submission_gives_the_same_run_as_through_the_shell() -> None:
    s = load_scenario("mooncake-16te", ["cluster.tes=2", "workload.requests=60"])
    direct = run_scenario(s)
    shell = run_scenario(s, build=_through_shells)
    assert direct.summary["completed"] == 60
    assert direct.summary == shell.summary  # same masters, same tasks, same instants
    assert direct.deliveries == shell.deliveries - 60  # one hop a request less
