"""The JE snapshots its live state (`Actor.snapshot_from_live`) instead of folding every event
since the last snapshot a second time. Only sound while its state changes only through `evolve`:
every periodic JE snapshot in the log must equal the fold of its events up to that step (the same
check as tests/actors/flowserve/test_snapshot_from_live.py, on the whole platform: gateway, JE,
control plane, on a Mooncake slice with frequent snapshots)."""

from __future__ import annotations

from typing import Any

from deepserve.actors.je.actor import JobExecutor
from deepserve.cluster.config import load
from deepserve.cluster.sim import run
from deepserve.core import MemorySink, decode, encode


def test_je_snapshots_taken_from_the_live_state_are_the_fold(monkeypatch: Any) -> None:
    assert JobExecutor.snapshot_from_live
    monkeypatch.setattr(JobExecutor, "snapshot_every", 64)  # many periodic snapshots in a short run
    sink = MemorySink()
    drivers: list[Any] = []
    result = run(load("mooncake-16te", ("cluster.tes=2",)), requests=300, sink=sink, on_end=drivers.append)
    assert result.summary["completed"] == 300
    (driver,) = drivers
    folds: dict[str, Any] = {}
    checked: dict[str, int] = {}
    for step in sink.steps:
        addr = step.input.actor
        if not addr.startswith("je/") or not isinstance(driver.actor(addr), JobExecutor):
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
    assert checked and min(checked.values()) >= 3, checked  # periodic snapshots, not only the start's
