"""The scenario run loop (deepserve/cluster/run.py) with test-double TEs: windowed injection of
a streamed trace, every request terminal, the summary computed from the terminal records."""

from __future__ import annotations

from typing import Any

from fake_te import FakeTe

from deepserve.adapters.scenario.loader import load_scenario
from deepserve.adapters.scenario.placement import place
from deepserve.cluster import run as run_mod
from deepserve.cluster.assembly import spawn_workload


def _fake_cluster(**fake: Any):
    def build(driver: Any, scenario: Any) -> None:
        placement = place(scenario.cluster)
        for te in placement.tes:
            driver.spawn(te.addr, FakeTe, **fake)
        spawn_workload(driver, scenario, placement)

    return build


def test_whole_slice_through_windows(monkeypatch: Any) -> None:
    monkeypatch.setattr(run_mod, "WINDOW_REQUESTS", 64)  # many windows over 300 requests
    s = load_scenario("mooncake-16te", ["cluster.tes=4"])
    seen: list[str] = []
    result = run_mod.run_scenario(s, build=_fake_cluster(), requests=300,
                                  on_done=lambda d: seen.append(d.request_id))  # fmt: skip
    assert result.injected == 300 and len(seen) == 300 and len(set(seen)) == 300
    assert result.workload["completed"] == 300 and result.workload["arrived"] == 300
    summary = result.summary
    assert summary["completed"] == 300 and summary["requests"] == 300
    assert summary["ttft_ms_p50"] > 0 and summary["tpot_ms_p50"] > 0
    assert summary["prefix_hit_rate"] > 0  # the double reports half the prompt cached


def test_windowing_does_not_change_the_result(monkeypatch: Any) -> None:
    s = load_scenario("pd-1p1d")
    monkeypatch.setattr(run_mod, "WINDOW_REQUESTS", 7)
    a = run_mod.run_scenario(s, build=_fake_cluster(), requests=50).summary
    monkeypatch.setattr(run_mod, "WINDOW_REQUESTS", 512)
    b = run_mod.run_scenario(s, build=_fake_cluster(), requests=50).summary
    assert a == b


def test_stuck_cluster_ends_every_request_recorded() -> None:
    s = load_scenario("mooncake-16te", ["cluster.tes=2"])
    result = run_mod.run_scenario(s, build=_fake_cluster(hang=True), requests=20, drain_limit_s=60)
    assert result.summary["failed"] == 20 and result.workload["failed"] == 20
    assert result.summary["completed"] == 0
