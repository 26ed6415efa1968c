"""The autoscaler in `deepserve sim` (issue 34 acceptance 2): the burst scenario with it on, off
and advisory; its settings refused naming the key; off, a run is what it was before."""

from __future__ import annotations

import json

import pytest

from deepserve.adapters.scenario.loader import ScenarioError
from deepserve.benchmarks.autoscale import below_s, windows
from deepserve.cluster import config, sim
from deepserve.cluster.autoscale import AUTOSCALER_ADDR
from deepserve.core.records import MemorySink
from deepserve.persistence import MemoryLog
from deepserve.replay import verify


def burst(*overrides: str) -> tuple[dict, list]:
    dones: list = []
    cfg = config.load("burst-autoscale", ["log=none", *overrides])
    return sim.run(cfg, on_done=dones.append).summary, dones


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[dict, list]]:
    return {"on": burst(), "off": burst("autoscale.enabled=false"), "advisory": burst("autoscale.advisory=true")}


def test_burst_recovers_with_the_autoscaler_and_ends_above_the_run_without(runs: dict) -> None:
    on, on_dones = runs["on"]
    off, off_dones = runs["off"]
    assert on["requests"] == off["requests"] == 500
    assert on["scale_outs"] >= 1 and off["scale_outs"] == 0
    assert on["slo_attainment"] > off["slo_attainment"] + 0.3
    # attainment (per 5 s of arrivals) is back above 90% within a bounded time, for good
    assert below_s(windows(on_dones, 2000.0, 100.0)) <= 10.0
    assert below_s(windows(off_dones, 2000.0, 100.0)) >= 20.0
    assert on["scale_ins"] >= 1  # and the burst's TEs are drained after it
    assert on["tes_ready_at_end"] < 1 + on["scale_outs"] or on["tes_target"] < 4


def test_advisory_records_the_same_advice_and_changes_nothing(runs: dict) -> None:
    adv, _ = runs["advisory"]
    off, _ = runs["off"]
    assert adv["autoscale_advisory"] is True and adv["autoscale_decisions"] >= 1
    assert adv["scale_outs"] == 0 and adv["te_loads_after_start"] == 0
    assert adv["tes_ready_at_end"] == 1
    assert adv["slo_attainment"] == off["slo_attainment"]


def test_every_decision_is_a_recorded_event_and_the_run_replays() -> None:
    cfg = config.load("burst-autoscale", ["log=none", "workload.requests=150"])
    sink = MemorySink()
    sim.run(cfg, sink=sink)
    decided = [e for st in sink.steps for e in st.events if e.actor == AUTOSCALER_ADDR and e.type == "AutoscaleDecided"]
    assert decided
    assert verify(MemoryLog(sink)).identical


@pytest.mark.parametrize(("setting", "key"), [
    ("autoscale.interval_s=0", "autoscale.interval_s"), ("autoscale.policies=['grow']", "autoscale.policies"),
    ("autoscale.scale_in_load=99", "autoscale"), ("autoscale.nonsense=1", "autoscale.nonsense"),
])  # fmt: skip
def test_bad_settings_name_the_key(setting: str, key: str) -> None:
    with pytest.raises(ScenarioError, match=key.replace(".", r"\.")):
        config.load("burst-autoscale", [setting])


def test_off_spawns_nothing_and_logs_the_config_as_before() -> None:
    cfg = config.load("burst-autoscale", ["log=none", "autoscale.enabled=false", "workload.requests=20"])
    ends: list = []
    sink = MemorySink()
    sim.run(cfg, on_end=ends.append, sink=sink)
    assert AUTOSCALER_ADDR not in ends[0].cells
    assert "autoscale" not in json.loads(sink.runs[0].config)
