"""`deepserve bench devices --json` prints the fabric rows, measured, each with its baseline."""

from __future__ import annotations

import json
from pathlib import Path

from cliproc import deepserve, in_process


def test_bench_devices_json_rows(tmp_path: Path) -> None:
    res = deepserve("bench", "devices", "--json", "--flows", "40", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    steady = {
        f"fabric_steady_{what}_per_{per}"
        for what in ("deliveries", "transfers")
        for per in ("s", "cpu_s")
    }
    npu = {"npu_run_passes_per_cpu_s", "npu_pass_model_per_cpu_s"}
    assert rows.keys() == {"fabric_flows_40_s", "fabric_flows_40_cpu_s", *steady, *npu}
    assert rows["fabric_flows_40_s"]["unit"] == "s"
    assert rows["fabric_flows_40_s"]["baseline"].startswith("fabric_flows_4_s")
    assert rows["fabric_steady_deliveries_per_s"]["baseline"].endswith("at 4 flows")
    for r in rows.values():
        assert r["value"] > 0 and r["baseline_value"] > 0
    # a transfer costs several kernel deliveries (request, ticks, answer)
    for per in ("s", "cpu_s"):
        ratio = rows[f"fabric_steady_deliveries_per_{per}"]["value"] / rows[
            f"fabric_steady_transfers_per_{per}"
        ]["value"]
        assert 2 <= ratio <= 5
    # an aggregated run costs far less per pass than the passes sent one by one
    for name in npu:
        assert rows[name]["value"] > 3 * rows[name]["baseline_value"], name


def test_bench_devices_bad_flow_count_is_one_line(tmp_path: Path) -> None:
    res = in_process("bench", "devices", "--flows", "3", cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1
    assert "--flows" in res.stderr and "Traceback" not in res.stderr
