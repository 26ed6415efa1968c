"""`deepserve bench replay --json` (issue 32, Speed): rows `whatif_s` with the run's own `sim_s` as
baseline, measured in the same run; the bench refuses to report a what-if that did not reproduce
the run. A few hundred requests keep it short (the full trace is the default)."""

from __future__ import annotations

import json
from pathlib import Path

from cliproc import in_process


def test_bench_replay_rows(tmp_path: Path) -> None:
    res = in_process("bench", "replay", "--requests", "200", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in map(json.loads, res.stdout.strip().splitlines())}
    assert rows["whatif_s"]["baseline"] == "sim_s" and rows["whatif_s"]["value"] > 0
    assert rows["whatif_s"]["baseline_value"] > 0
    assert 0 < rows["whatif_read_s"]["value"] < rows["whatif_s"]["value"]
    assert rows["whatif_cpu_s"]["value"] > 0 and rows["whatif_cpu_s"]["baseline_value"] > 0
    assert rows["requests"]["value"] == rows["requests"]["baseline_value"] == 200
    half = rows["whatif_from_half_s"]  # forked at half the run (restored from its log), the whole what-if beside it
    assert half["baseline"].startswith("whatif_s") and half["value"] > 0
    assert half["baseline_value"] == rows["whatif_s"]["value"]
    assert rows["whatif_from_half_cpu_s"]["value"] > 0


def test_bench_replay_bad_override_is_one_line(tmp_path: Path) -> None:
    res = in_process("bench", "replay", "--requests", "10", "--set", "cluster.nope=1", cwd=tmp_path)
    assert res.returncode == 2 and "cluster.nope" in res.stderr and len(res.stderr.strip().splitlines()) == 1
