"""The JE snapshots its live state (`Actor.snapshot_from_live`) instead of folding every event
since the last snapshot a second time. Only sound while its state changes only through `evolve`:
every periodic JE snapshot in the log must equal the fold of its events up to that step (the same
check as tests/actors/flowserve/test_snapshot_from_live.py, on the whole platform: gateway, JE,
control plane, on a Mooncake slice with frequent snapshots)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from deepserve.actors.je.actor import JobExecutor
from deepserve.cluster.config import load
from deepserve.cluster.sim import run
from deepserve.core import MemorySink

sys.path.insert(0, str(Path(__file__).parent.parent / "flowserve"))
from snapshot_fold import checked_snapshots  # noqa: E402


def test_je_snapshots_taken_from_the_live_state_are_the_fold(monkeypatch: Any) -> None:
    assert JobExecutor.snapshot_from_live
    monkeypatch.setattr(JobExecutor, "snapshot_every", 64)  # many periodic snapshots in a short run
    sink = MemorySink()
    drivers: list[Any] = []
    result = run(load("mooncake-16te", ("cluster.tes=2",)), requests=300, sink=sink, on_end=drivers.append)
    assert result.summary["completed"] == 300
    (driver,) = drivers
    checked = checked_snapshots(sink, driver, "je/", JobExecutor)
    assert checked and min(checked.values()) >= 3, checked  # periodic snapshots, not only the start's
