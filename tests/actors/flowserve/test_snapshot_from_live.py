"""The DP master and the NPU snapshot their live state (`Actor.snapshot_from_live`) instead of
folding every event since the last snapshot a second time. That is only sound while their state
changes only through `evolve`: every periodic snapshot in the log must equal the fold of the
actor's events up to that step, which this checks on a Mooncake slice with frequent snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.flowserve.master.actor import DpMaster
from deepserve.adapters.hardware.devices.npu import Npu
from deepserve.adapters.scenario.loader import load_scenario
from deepserve.cluster.run import run_scenario
from deepserve.core import MemorySink, decode, encode


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
    folds: dict[str, Any] = {}
    checked: dict[str, int] = {}
    for step in sink.steps:
        addr = step.input.actor
        if not addr.startswith(prefix) or not isinstance(driver.actor(addr), cls):
            continue
        actor = driver.actor(addr)
        state = folds.get(addr)
        if state is None:
            state = actor.initial_state()
        for rec in step.events:
            event = decode(rec.type, rec.payload)
            if not event.system:
                state = actor.evolve(state, event)
        folds[addr] = state
        if step.snapshot is not None and step.input.seq >= 0 and step.input.kind == 0:
            assert step.snapshot.payload == encode(state), f"{addr} at seq {step.input.seq}"
            checked[addr] = checked.get(addr, 0) + 1
    # Periodic snapshots (not only the start's) were compared, on several actors
    assert sum(1 for n in checked.values() if n >= 3) >= 2, checked
