"""`deepserve bench recovery`'s KV-migration rows (issue 33 §2-3): the same colocated pool and
Mooncake workload hit by an NPU crash (the host lives: its DRAM keeps the written-through KV) and
by a TE process kill (its host memory goes with it), each with migration recomputing and with
migration moving the KV."""

from __future__ import annotations

import json
from pathlib import Path

from cliproc import deepserve

from deepserve.benchmarks.recovery import run_table


def test_kv_survives_a_device_fault_not_a_process_kill() -> None:
    rows = {(c.fault, c.rung): c for c in run_table(["colo-npu-crash", "colo-process-kill"], requests=60,
                                                    rungs=["migrate", "migrate-kv"], stream=True)}  # fmt: skip
    for c in rows.values():
        assert c.failed == 0 and c.completed == c.requests and c.migrated > 0, c
    crash, crash_kv = rows["colo-npu-crash", "migrate"], rows["colo-npu-crash", "migrate-kv"]
    kill, kill_kv = rows["colo-process-kill", "migrate"], rows["colo-process-kill", "migrate-kv"]
    assert crash.migrated_kv == 0 and crash.kv_blocks_moved == 0  # migration without KV: all recompute
    assert crash_kv.migrated_kv == crash_kv.migrated and crash_kv.kv_blocks_moved > 0
    assert crash_kv.tokens_recomputed * 10 < crash.tokens_recomputed  # only the tails
    assert kill_kv.migrated_kv == 0 and kill_kv.kv_blocks_moved == 0  # nothing survived the process
    assert kill_kv.tokens_recomputed > kill.tokens_recomputed * 0.9


def test_the_json_carries_the_kv_columns(tmp_path: Path) -> None:
    res = deepserve("bench", "recovery", "--json", "--stream", "--faults", "colo-process-kill", "--rungs", "migrate-kv",
                    "--requests", "20", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    (doc,) = map(json.loads, res.stdout.splitlines())
    (row,) = doc["rows"]
    assert (row["rung"], row["migrated_kv"], row["kv_blocks_moved"]) == ("migrate-kv", 0, 0)
    assert row["tokens_recomputed"] > 0 and "mooncake" in row["pool"]
