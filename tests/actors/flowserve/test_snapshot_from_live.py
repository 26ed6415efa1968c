"""The DP master and the NPU snapshot their live state (`Actor.snapshot_from_live`) instead of
folding every event since the last snapshot a second time. That is only sound while their state
changes only through `evolve`: every periodic snapshot in the log must equal the fold of the
actor's events up to that step, which this checks on a Mooncake slice with frequent snapshots."""

from __future__ import annotations

from typing import Any

import pytest
from snapshot_fold import checked_snapshots

from deepserve.actors.flowserve.master.actor import DpMaster
from deepserve.adapters.hardware.devices.npu import Npu
from deepserve.adapters.scenario.loader import load_scenario
from deepserve.cluster.run import run_scenario
from deepserve.core import MemorySink


@pytest.mark.parametrize("cls, prefix", [(DpMaster, "te/"), (Npu, "hw/")])
def test_snapshots_taken_from_the_live_state_are_the_fold(monkeypatch: Any, cls: type, prefix: str) -> None:
    assert cls.snapshot_from_live
    monkeypatch.setattr(cls, "snapshot_every", 64)  # many periodic snapshots in a short run
    sink = MemorySink()
    drivers: list[Any] = []
    scenario = load_scenario("mooncake-16te", ("cluster.tes=2",))
    result = run_scenario(scenario, requests=200, sink=sink, on_end=drivers.append)
    assert result.summary["completed"] == 200
    (driver,) = drivers
    checked = checked_snapshots(sink, driver, prefix, cls)
    # Periodic snapshots (not only the start's) were compared, on several actors
    assert sum(1 for n in checked.values() if n >= 3) >= 2, checked
