"""Contention among cold starts on one host (issue 34: cold-boot costs from published sources;
`[scaling] import_serial`): vllm-ascend issue #1228 reports the 8 engine processes of a DP8 TP1
launch starting one after another, serialised by `import torch_npu`. With `import_serial` on,
the k-th cold start planned on a server while k others are still starting there waits k imports
(`python_import_s` each); a pre-warmed TE waits for nothing; off (the default), nothing changes."""

from __future__ import annotations

import pytest

from deepserve.actors.cluster.prewarm import Pools, Scaling, plan_boot
from deepserve.benchmarks.scaling import SCALE_AT_S, VARIANTS, run_scale_out
from deepserve.cluster.control import MANAGER_ADDR


def pre_loads(r: dict) -> dict[int, list[float]]:  # type: ignore[type-arg]
    st = r["driver"].actor(MANAGER_ADDR).state
    slots = {s.te: s.server for s in r["driver"].actor(MANAGER_ADDR).cfg.slots}
    out: dict[int, list[float]] = {}
    for te, rec in st.tes.items():
        if rec.launched_s >= SCALE_AT_S:
            out.setdefault(slots[te], []).append(round(rec.steps["te_pre_load"], 6))
    return {k: sorted(v) for k, v in out.items()}


def test_a_queued_cold_start_waits_the_imports_ahead_of_it() -> None:
    cfg = Scaling(enabled=True, import_serial=True)
    plan = plan_boot(cfg, Pools(), 0, 1, 1, 2.0, queued=3)
    assert plan.te_pre_load_s == pytest.approx(cfg.cold_pre_load_s() + 3 * cfg.python_import_s)
    assert "import queue 3 x" in plan.pre_load_detail
    off = plan_boot(Scaling(enabled=True), Pools(), 0, 1, 1, 2.0, queued=3)
    assert off.te_pre_load_s == pytest.approx(Scaling().cold_pre_load_s())
    warm = plan_boot(cfg, Pools(masters=1, executors={"0": 1}), 0, 1, 1, 2.0, queued=3)
    assert warm.te_prewarmed and warm.te_pre_load_s == pytest.approx(cfg.te_attach_s)


def test_eight_cold_starts_on_one_server_import_one_after_another() -> None:
    cfg = Scaling(enabled=True, import_serial=True)
    serial = pre_loads(run_scale_out(VARIANTS["cold_serial_import"], new_tes=8))
    # 7 new TEs beside te/0 on server 0, the 8th alone on server 1
    cold = cfg.cold_pre_load_s()
    assert serial[0] == [pytest.approx(cold + k * cfg.python_import_s) for k in range(7)]
    assert serial[1] == [pytest.approx(cold)]
    parallel = pre_loads(run_scale_out(VARIANTS["cold"], new_tes=8))
    assert parallel[0] == [pytest.approx(cold)] * 7
