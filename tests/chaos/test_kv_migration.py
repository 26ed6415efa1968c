"""KV migration from a failed TE's host DRAM (xLLM §3.5 with its multi-level KV cache; issue 33 §2),
in virtual time through the chaos runner (every invariant checked, the log replayed): colocated
TEs writing their prompt KV through to host DRAM (`cluster.resilience.kv_backup`), the JE moving
a failed TE's streams with their surviving KV when cheaper (`scheduling.migration.kv`).

- An NPU crash leaves the host alive: the moved requests' leading blocks are pulled from its DRAM
  over the fabric, the targets prefill only the tail, no request fails, and every stream's token
  ids equal the undisturbed run's.
- A TE process kill takes its host memory with it: nothing is offered, everything recomputes.
"""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.adapters.scenario.faults import FaultSpec
from deepserve.adapters.scenario.loader import ScenarioError
from deepserve.chaos import runner
from deepserve.chaos.platform import load_config
from deepserve.core.codec import decode
from deepserve.persistence import open_log

KV = ("cluster.mode=colocated", "cluster.tes=4", "workload.trace=builtin:mooncake_conv_1k", "workload.requests=30",
      "cluster.kv_dram_gb=128", "cluster.resilience.kv_backup=true", "scheduling.migration.enabled=true",
      "scheduling.migration.kv=true")  # fmt: skip
WATCHED = ("TaskMigrated", "KvImportEnded", "JobFinished")


def _run(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, faults: tuple[FaultSpec, ...],
         overrides: tuple[str, ...] = KV) -> tuple[Any, dict[str, list[int]], dict[str, list[Any]]]:  # fmt: skip
    """One seed: its result, each request's streamed token ids, and the watched JE events."""
    tmp_path.mkdir(exist_ok=True)
    ids: dict[str, list[int]] = {}
    real = runner.Checker._extend

    def extend(self: Any, rid: str, first: int, n: int, got: tuple[int, ...], expected: int) -> None:
        real(self, rid, first, n, got, expected)
        if rid in self.ids:
            ids[rid] = list(self.ids[rid])

    monkeypatch.setattr(runner.Checker, "_extend", extend)
    monkeypatch.setattr(runner.schedule, "draw", lambda *a, **k: faults)
    r = runner.run_seed(load_config("pd-1p1d", overrides), 3, None, str(tmp_path), keep_log=True)
    events: dict[str, list[Any]] = {k: [] for k in WATCHED}
    reader = open_log(r.log)
    try:
        for step in reader.steps():
            for ev in step.events:
                if ev.type in events:
                    events[ev.type].append(decode(ev.type, ev.payload))
    finally:
        reader.close()
    return r, ids, events


def test_an_npu_crash_moves_the_surviving_kv_and_the_streams_stay_whole(tmp_path, monkeypatch) -> None:
    base, base_ids, _ = _run(tmp_path / "base", monkeypatch, ())
    r, got_ids, ev = _run(tmp_path / "crash", monkeypatch, (FaultSpec(at_s=10.0, kind="npu-crash", target="hw/s0/npu2"),))
    assert r.violations == 0, r.first
    assert (r.completed, r.failed) == (r.requests, 0)
    moved = [e for e in ev["TaskMigrated"] if e.choice.mode == "migrate"]
    imported = [e for e in ev["KvImportEnded"] if e.ok and e.blocks]
    assert moved and len(imported) == len(moved), (len(moved), [e.reason for e in ev["KvImportEnded"]])
    blocks = sum(e.blocks for e in imported)
    assert blocks > 0 and sum(e.nbytes for e in imported) == blocks * 16 * 2**20  # llama3-8b: 16 MiB a block
    # the target prefilled only the tail: the moved blocks came from its cache
    done = {e.done.request_id: e.done for e in ev["JobFinished"]}
    for e in imported:
        assert done[e.request_id].cached_prompt_tokens >= e.blocks * 128, e
    for m in moved:  # what it priced: far fewer tokens recomputed than the request holds
        assert m.choice.recompute_tokens < (m.choice.kv_bytes // 131072) // 4, m.choice
    assert base.violations == 0 and got_ids == base_ids  # every stream's text is the undisturbed run's


def test_a_process_kill_leaves_no_kv_and_everything_recomputes(tmp_path, monkeypatch) -> None:
    r, _, ev = _run(tmp_path, monkeypatch, (FaultSpec(at_s=10.0, kind="kill-te-process", target="te/2"),))
    assert r.violations == 0, r.first
    assert (r.completed, r.failed) == (r.requests, 0)
    assert ev["TaskMigrated"] and all(e.choice.mode == "recompute" and not e.choice.survived_blocks
                                      for e in ev["TaskMigrated"])  # fmt: skip
    assert not ev["KvImportEnded"]


@pytest.mark.parametrize(("overrides", "key"), [
    (("scheduling.migration.kv=true",), "scheduling.migration.kv"),
    (("cluster.resilience.kv_backup=true",), "cluster.resilience.kv_backup"),
])  # fmt: skip
def test_a_kv_setting_without_what_it_needs_is_refused_naming_it(overrides: tuple[str, ...], key: str) -> None:
    with pytest.raises(ScenarioError) as bad:
        load_config("pd-1p1d", overrides)
    assert bad.value.key == key
