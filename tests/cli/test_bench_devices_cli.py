"""`deepserve bench devices --json` prints the fabric rows, measured, each with its baseline."""

from __future__ import annotations

import json
from pathlib import Path

from cliproc import deepserve


def test_bench_devices_json_rows(tmp_path: Path) -> None:
    res = deepserve("bench", "devices", "--json", "--flows", "40", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert rows.keys() == {"fabric_flows_40_s", "fabric_steady_deliveries_per_s"}
    assert rows["fabric_flows_40_s"]["unit"] == "s"
    assert rows["fabric_flows_40_s"]["baseline"].startswith("fabric_flows_4_s")
    assert rows["fabric_steady_deliveries_per_s"]["baseline"].endswith("at 4 flows")
    for r in rows.values():
        assert r["value"] > 0 and r["baseline_value"] > 0


def test_bench_devices_bad_flow_count_is_one_line(tmp_path: Path) -> None:
    res = deepserve("bench", "devices", "--flows", "3", cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1
    assert "--flows" in res.stderr and "Traceback" not in res.stderr
