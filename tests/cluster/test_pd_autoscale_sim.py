"""P/D ratio adjustment and dynamic role switching in `deepserve sim` (issue 34 acceptance 3):
each beside its baseline on the same trace and seed (benchmarks/autoscale.py's rows)."""

from __future__ import annotations

from pathlib import Path

from deepserve.benchmarks.autoscale import pd_ratio_row, role_switch_row, scale_to_zero_row


def test_adjusted_pd_ratio_beats_the_fixed_one_when_output_lengths_shift(tmp_path: Path) -> None:
    row = pd_ratio_row(tmp_path, requests=400, other_splits=False)  # bench autoscale: 600
    assert row.detail["flips"] >= 2  # toward prefill in the short half, back toward decode in the long one
    assert row.detail["failed"] == 0  # a flipped TE's open tasks ran on
    assert row.value >= row.baseline * 1.2, row


def test_role_switching_flips_without_reloading_and_beats_the_static_split() -> None:
    row = role_switch_row(requests=250)  # the burst at the slice's start (bench autoscale runs all 500)
    assert row.detail["flips"] >= 1
    assert row.detail["failed"] == 0
    assert row.detail["te_loads"] == 0  # a flip is membership only: no TE loaded weights after the start
    assert row.value > row.baseline + 0.2, row
    assert row.detail["from_2p2d"] >= row.detail["static_2p2d"]  # from the split that suits it: no loss


def test_an_idle_model_scales_to_zero_and_its_next_request_waits_out_a_measured_cold_start(tmp_path: Path) -> None:
    row = scale_to_zero_row(tmp_path)
    assert row.detail["scale_ins"] >= 1 and row.detail["scale_outs"] >= 1
    assert row.detail["failed"] == 0  # the requests that came to no TE parked until one booted
    # pod start 1 s + TE-Pre-Load 2 s + SSD -> DRAM -> NPU: seconds, against milliseconds warm
    assert row.value > 3.0 and row.baseline < 0.5, row


def test_the_profiled_ratio_moves_the_split_to_eq1_once_and_stays() -> None:
    from deepserve.benchmarks.autoscale import PD_SLO, _run, pd_config

    # llama3-8b on 910b, 1024-token prompts, 256-token outputs, decode batch 64: eq. 1 gives 1P3D
    auto = {"enabled": True, "policies": ["pd_ratio"], "ratio_source": "profile", "min_decode": 1}
    s = _run(pd_config(2, 2, "builtin:azure_conv_500", auto, PD_SLO, requests=100))[0]
    assert s["flips"] == 1 and s["failed"] == 0 and s["te_loads_after_start"] == 0, s
