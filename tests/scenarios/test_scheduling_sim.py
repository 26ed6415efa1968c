"""Issue 6 in `deepserve sim`: a [scheduling] section routes a trace through gateway -> JE ->
FlowServe TEs. round_robin through the JE reproduces the workload stand-in exactly; load_aware
(locality while balanced) raises the prefix hit rate on the Mooncake conversation slice."""

from __future__ import annotations

import pytest
from scenario_util import run, scenario, show

from deepserve.adapters.scenario.loader import ScenarioError

N = 200


def test_round_robin_through_the_je_matches_the_stand_in_and_locality_raises_hits() -> None:
    base = ("cluster.tes=8",)
    stand_in, leaks = run(scenario("mooncake-16te", *base), N)
    assert not leaks
    rr, _ = run(scenario("mooncake-16te", *base, "scheduling.policy=round_robin"), N)
    la, leaks = run(scenario("mooncake-16te", *base, "scheduling.policy=load_aware"), N)
    for label, r in (("stand-in", stand_in), ("round_robin", rr), ("load_aware", la)):
        show(label, r.summary)
        assert r.summary["completed"] == N and r.workload["arrived"] == N
    assert not leaks
    assert rr.summary["prefix_hit_rate"] == stand_in.summary["prefix_hit_rate"]
    assert rr.summary["ttft_ms_p50"] == pytest.approx(stand_in.summary["ttft_ms_p50"], rel=1e-9)
    # On 200 requests the gain depends on the NPUs' variance draws: 1.38x-1.58x over seeds 0-3
    # (1.50x with variance off), measured 2026-11-23 with both variance streams (sim-npu)
    assert la.summary["prefix_hit_rate"] > 1.3 * rr.summary["prefix_hit_rate"]


def test_bad_scheduling_section_names_the_key() -> None:
    with pytest.raises(ScenarioError, match="scheduling.policy"):
        scenario("pd-1p1d", "scheduling.policy=fastest")
    with pytest.raises(ScenarioError, match="scheduling.params.treshold"):
        scenario("pd-1p1d", "scheduling.policy=load_aware", "scheduling.params.treshold=3")
    with pytest.raises(ScenarioError, match="scheduling.heatmap"):
        scenario("pd-1p1d", "scheduling.policy=pd_aware", "scheduling.heatmap=/nonexistent.json")
