"""`deepserve bench autoscale`: a row beside its baseline as JSON; a bad --rows is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deepserve", "bench", "autoscale", *args], capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_one_row_as_json_beside_its_baseline() -> None:
    out = bench("--rows", "scale_to_zero_first_ttft_s", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["rows"]
    assert row["name"] == "scale_to_zero_first_ttft_s" and row["value"] > row["baseline"] > 0


def test_an_unknown_row_is_named_in_one_line() -> None:
    out = bench("--rows", "nope")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "--rows: unknown row 'nope'" in out.stderr and "burst_slo_attainment" in out.stderr
