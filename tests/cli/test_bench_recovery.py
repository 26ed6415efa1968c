"""`deepserve bench recovery --json`: one row per (fault, rung that applies), same workload and
seed, the `replace` rung (today's) the baseline of each fault; bad arguments one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from cliproc import assert_one_line_error, deepserve, in_process

from deepserve.benchmarks.recovery import FAULTS, RUNGS, SETTINGS
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
    assert FAULT_NAMES == tuple(FAULTS) and RUNG_NAMES == RUNGS + tuple(SETTINGS)


def test_bench_recovery_bad_arguments(tmp_path: Path) -> None:
    assert_one_line_error(in_process("bench", "recovery", "--faults", "npu-melt", cwd=tmp_path), "npu-melt")
    assert_one_line_error(in_process("bench", "recovery", "--rungs", "reboot", cwd=tmp_path), "reboot")
    assert_one_line_error(in_process("bench", "recovery", "--requests", "0", cwd=tmp_path), "--requests")


def test_the_rungs_below_the_manager_on_a_transient_link_error_with_streaming_clients() -> None:
    from deepserve.benchmarks.recovery import run_table

    rows = {c.rung: c for c in run_table(["link-transient"], requests=40, stream=True)}
    assert list(rows) == ["replace", "token-recompute", "migrate"]
    base, recompute, migrate = rows["replace"], rows["token-recompute"], rows["migrate"]
    assert base.failed == base.affected > 0 and base.migrated == 0  # today: the pass's streams fail
    # every DP group rolls the pass back and runs it again: nothing fails, the pass's tokens again
    assert (recompute.affected, recompute.failed, recompute.diagnosis) == (0, 0, "rolled back")
    assert recompute.tokens_regenerated == base.affected  # one token each of the tasks in the pass
    # the JE moves the failed streams on: none fails, each continues where its client was
    assert migrate.failed == 0 and migrate.migrated == base.affected and migrate.completed == 40
