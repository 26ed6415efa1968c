"""`deepserve bench kernel --json` prints every row, measured, with its baseline."""

from __future__ import annotations

import json
from pathlib import Path

from cliproc import deepserve, in_process

ROWS = {
    "sim_deliveries_per_s_nolog", "sim_deliveries_per_s_logged", "async_msgs_per_s",
    "async_roundtrips_per_s", "store_records_per_s_sqlite", "replay_inputs_per_s",
}


def test_bench_kernel_json_rows(tmp_path: Path) -> None:
    res = deepserve("bench", "kernel", "--json", "--scale", "0.02", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert ROWS <= rows.keys()
    for r in rows.values():
        assert set(r) == {"name", "value", "unit", "baseline", "baseline_value", "build"}
        assert r["build"] in ("compiled", "pure", "stale")
        assert r["value"] > 0 and r["unit"].endswith("/s")
        assert r["baseline"] and r["baseline_value"] > 0


def test_bench_bad_arguments_are_one_line(tmp_path: Path) -> None:
    for args in (("bench",), ("bench", "nosuch"), ("bench", "kernel", "--scale", "-1")):
        res = in_process(*args, cwd=tmp_path)
        assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, (args, res.stderr)
        assert "Traceback" not in res.stderr
