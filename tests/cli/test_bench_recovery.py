"""`deepserve bench recovery --json`: one row per (fault, rung that applies), same workload and
seed, the `replace` rung (today's) the baseline of each fault; bad arguments one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from cliproc import assert_one_line_error, deepserve, in_process

from deepserve.benchmarks.recovery import FAULTS, RUNGS
from deepserve.cli.bench_recovery import FAULT_NAMES, RUNG_NAMES


def test_bench_recovery_json_table(tmp_path: Path) -> None:
    res = deepserve("bench", "recovery", "--json", "--requests", "40", "--faults", "te-process-kill,link-down",
                    "--rungs", "replace,substitute,restart-world", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    (doc,) = map(json.loads, res.stdout.splitlines())
    assert doc["workload"]["requests"] == 40 and doc["workload"]["baseline"] == "replace"
    rows = {(r["fault"], r["rung"]): r for r in doc["rows"]}
    # a link fault declares no TE failed: only the baseline applies
    assert list(rows) == [("te-process-kill", "replace"), ("te-process-kill", "restart-world"),
                          ("te-process-kill", "substitute"), ("link-down", "replace")]  # fmt: skip
    kill = rows[("te-process-kill", "replace")]
    assert (kill["detected_s"], kill["diagnosis"], kill["failed"], kill["completed"]) == (0.0, "exited", 0, 40)
    assert kill["affected"] == kill["recomputed"] > 0 and kill["tokens_regenerated"] > 0
    world = rows[("te-process-kill", "restart-world")]
    assert world["serving_min"] == 0 and world["recovered_s"] > kill["recovered_s"]
    assert "in place" in rows[("te-process-kill", "substitute")]["choice"]  # the process died, not its node
    link = rows[("link-down", "replace")]
    assert link["detected_s"] is None and link["recovered_s"] is None and link["affected"] > 0


def test_bench_recovery_names_match_the_bench() -> None:
    assert FAULT_NAMES == tuple(FAULTS) and RUNG_NAMES == RUNGS


def test_bench_recovery_bad_arguments(tmp_path: Path) -> None:
    assert_one_line_error(in_process("bench", "recovery", "--faults", "npu-melt", cwd=tmp_path), "npu-melt")
    assert_one_line_error(in_process("bench", "recovery", "--rungs", "reboot", cwd=tmp_path), "reboot")
    assert_one_line_error(in_process("bench", "recovery", "--requests", "0", cwd=tmp_path), "--requests")
