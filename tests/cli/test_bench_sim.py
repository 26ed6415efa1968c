"""`deepserve bench sim --json`: the issue-10 rows, each measured, the speed row with its
same-run baselines (the same run in one process; that one with the log off), and the whole
platform's run (what `deepserve sim` runs) beside the one-process run."""

from __future__ import annotations

import json
from pathlib import Path

from cliproc import assert_one_line_error, deepserve, in_process


def test_bench_sim_json_rows(tmp_path: Path) -> None:
    res = deepserve("bench", "sim", "--json", "--requests", "30", "--set", "cluster.tes=2", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert {"sim_requests_per_wall_s", "requests", "prefix_hit_rate", "ttft_ms_p50", "tpot_ms_p50",
            "harness_requests_per_wall_s", "sim_requests_per_cpu_s"} <= rows.keys()
    speed = rows["sim_requests_per_wall_s"]
    assert speed["value"] > 0 and speed["baseline"] == "sim_requests_per_wall_s_one_process"
    assert speed["baseline_value"] > 0
    one = rows["sim_requests_per_wall_s_one_process"]
    assert one["baseline"] == "sim_requests_per_wall_s_log_off" and one["baseline_value"] > 0
    assert rows["workers"]["value"] >= 1
    platform = rows["platform_requests_per_wall_s"]  # what `deepserve sim` runs: the whole platform
    assert platform["value"] > 0 and platform["baseline"] == "sim_requests_per_wall_s_one_process"
    assert 0 <= rows["prefix_hit_rate"]["baseline_value"] <= 1
    assert rows["requests"]["value"] == rows["requests"]["baseline_value"] == 30  # all completed
    assert rows["ttft_ms_p50"]["value"] > 0 and rows["tpot_ms_p50"]["value"] > 0


def test_bench_sim_bad_override(tmp_path: Path) -> None:
    assert_one_line_error(in_process("bench", "sim", "--set", "cluster.x=1", cwd=tmp_path), "cluster.x")
