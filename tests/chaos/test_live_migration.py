"""Live migration (issue 33 §2 with xLLM §3.5): a colocated TE drained by a scale-in (`ScaleGroup`,
what the autoscaler sends) moves its running streams at once with their KV read from its working HBM, instead of holding
the TE until they finish — through the chaos runner (every invariant checked, the log replayed).
With live migration the drained TE stops sooner; the streams' token ids equal the undisturbed
run's."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.cluster.messages import ScaleGroup
from deepserve.chaos import runner
from deepserve.chaos.platform import load_config
from deepserve.cluster.control import MANAGER_ADDR
from deepserve.core.codec import decode
from deepserve.persistence import open_log

BASE = ("cluster.mode=colocated", "cluster.tes=4", "workload.trace=builtin:mooncake_conv_1k", "workload.requests=30",
        "scheduling.migration.enabled=true")  # fmt: skip
LIVE = (*BASE, "cluster.kv_dram_gb=128", "scheduling.migration.kv=true", "scheduling.migration.live=true")
DRAIN_AT_S = 10.0
WATCHED = ("TaskMigrated", "KvImportEnded", "TeStopped", "TeDraining")


def _run(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...],
         drain: bool = True) -> tuple[Any, dict[str, list[int]], dict[str, list[tuple[float, Any]]]]:  # fmt: skip
    tmp_path.mkdir(exist_ok=True)
    ids: dict[str, list[int]] = {}
    real = runner.Checker._extend

    def extend(self: Any, rid: str, first: int, n: int, got: tuple[int, ...], expected: int) -> None:
        real(self, rid, first, n, got, expected)
        if rid in self.ids:
            ids[rid] = list(self.ids[rid])

    monkeypatch.setattr(runner.Checker, "_extend", extend)
    monkeypatch.setattr(runner.schedule, "draw", lambda *a, **k: ())
    drains = [(DRAIN_AT_S, MANAGER_ADDR, ScaleGroup(group="llama3-8b/colocated", size=3))] if drain else []
    monkeypatch.setattr(runner.schedule, "injections", lambda faults, start, gateway="": [
        (start + t, dst, msg) for t, dst, msg in drains])  # fmt: skip
    r = runner.run_seed(load_config("pd-1p1d", overrides), 3, None, str(tmp_path), keep_log=True)
    events: dict[str, list[tuple[float, Any]]] = {k: [] for k in WATCHED}
    reader = open_log(r.log)
    try:
        for step in reader.steps():
            for ev in step.events:
                if ev.type in events:
                    events[ev.type].append((step.input.t, decode(ev.type, ev.payload)))
    finally:
        reader.close()
    return r, ids, events


def test_a_draining_te_s_streams_move_with_their_kv_and_it_stops_sooner(tmp_path, monkeypatch) -> None:
    _, base_ids, _ = _run(tmp_path / "undisturbed", monkeypatch, BASE, drain=False)
    waited, _, ev0 = _run(tmp_path / "wait", monkeypatch, BASE)
    live, ids, ev = _run(tmp_path / "live", monkeypatch, LIVE)
    for r in (waited, live):
        # the one convergence note: the drained TE is not replaced (an operator's drain shrinks the group)
        assert [v for v in r.listed if v.invariant != "convergence"] == [], r.first
        assert [v.detail.split(" after")[0] for v in r.listed] == ["llama3-8b/colocated: 3 of 4 TEs ready"]
        assert (r.completed, r.failed) == (r.requests, 0)
    assert not ev0["TaskMigrated"]  # without live migration the streams finish where they are
    moved = [e for _, e in ev["TaskMigrated"] if e.failure.startswith("live migration")]
    imported = [e for _, e in ev["KvImportEnded"] if e.ok and e.blocks]
    (te,) = {e.te for _, e in ev["TeDraining"]}  # the scale-in's victim (the last ready TE)
    assert moved and imported and {e.from_te for e in moved} == {te}
    assert all(e.choice.srcs and e.choice.srcs[0].startswith("hw/s0/npu") for e in moved if e.choice.mode == "migrate")
    drained_at = [t for t, e in ev0["TeStopped"] if e.te == te]
    live_at = [t for t, e in ev["TeStopped"] if e.te == te]
    assert drained_at and live_at and live_at[0] < drained_at[0], (live_at, drained_at)
    assert ids == base_ids  # every stream's token ids are the undisturbed run's
