"""`deepserve bench policies` and `deepserve profile heatmap|predictor` from the CLI: a tiny
grid end to end (rows with exactly the issue's fields, the PNG), and precise refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, in_process

FIELDS = ["policy", "trace", "cluster", "rps", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
          "jct_ms_p50", "jct_ms_p99", "slo_attainment", "prefix_hit_rate"]


def test_profile_heatmap_then_bench_policies_json_rows(tmp_path: Path) -> None:
    heat = tmp_path / "heat.json"
    res = in_process("profile", "heatmap", "--prefill", "512,4096", "--ratio", "0.0625,1", "--rps", "1",
                    "--requests", "6", "--out", str(heat), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    data = json.loads(heat.read_text())
    assert data["heatmap"]["prefill_edges"] == [512, 4096] and len(data["cells"]) == 4
    assert all(c["value"] == pytest.approx(c["jct_ms_colocated"] / c["jct_ms_pd"] - 1) for c in data["cells"])
    assert heat.with_suffix(".png").stat().st_size > 1000
    png = tmp_path / "p.png"
    res = in_process("bench", "policies", "--cluster", "fig7", "--rps", "1,2", "--requests", "12",
                    "--policies", "round_robin,pd_aware", "--trace", "configs/traces/azure_conv_500.csv",
                    "--heatmap", str(heat), "--predictor", str(tmp_path / "missing.json"), "--json",
                    "--png", str(png), cwd=Path.cwd())
    assert_one_line_error(res, "--predictor: no file")
    pred = tmp_path / "pred.json"
    res = in_process("profile", "predictor", "--trace", "configs/traces/azure_conv_500.csv", "--max-depth", "3",
                    "--out", str(pred), "--json", cwd=Path.cwd())
    assert res.returncode == 0, res.stderr
    assert 0 <= json.loads(res.stdout)["accuracy_held_out"] <= 1
    res = in_process("bench", "policies", "--cluster", "fig7", "--rps", "1,2", "--requests", "12",
                    "--policies", "round_robin,pd_aware", "--trace", "configs/traces/azure_conv_500.csv",
                    "--heatmap", str(heat), "--predictor", str(pred), "--json", "--png", str(png), cwd=Path.cwd())
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [list(r) for r in rows] == [FIELDS] * 4
    assert {(r["policy"], r["rps"]) for r in rows} == {(p, x) for p in ("round_robin", "pd_aware") for x in (1.0, 2.0)}
    assert all(0 <= r["slo_attainment"] <= 1 and r["jct_ms_p50"] >= r["ttft_ms_p50"] > 0 for r in rows)
    assert png.stat().st_size > 1000


@pytest.mark.parametrize(("args", "needles"), [
    (["--rps", "1,x"], ["--rps", "expected numbers separated by commas, got '1,x'"]),
    (["--rps", "0"], ["--rps"]),
    (["--policies", "round_robin,fastest"], ["--policies", "unknown policy 'fastest'"]),
    (["--cluster", "huge"], ["--cluster", "'huge' is neither a built-in cluster"]),
    (["--trace", "/nonexistent.csv"], ["/nonexistent.csv"]),
    (["--requests", "0"], ["--requests"]),
    (["--forwarding", "eager"], ["--forwarding", "unknown mode 'eager'"]),
])
def test_bench_policies_refuses_bad_arguments(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    assert_one_line_error(in_process("bench", "policies", *args, cwd=tmp_path), *needles)


def test_bench_policies_cluster_file_fields_are_validated(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text("colocated = 2\npairs = -1\n")
    assert_one_line_error(in_process("bench", "policies", "--cluster", str(bad), cwd=tmp_path), "pairs")
