"""`deepserve bench sim --dynamo`: `deepserve sim` against NVIDIA Dynamo's mocker, side by side
(issue 31 §5). The mocker's run needs the optional extra `dynamo` (ai-dynamo-runtime); without it
the bench says so in one line and keeps deepserve's rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, deepserve, in_process

from deepserve.adapters.scenario.loader import load_scenario
from deepserve.benchmarks import sim_dynamo
from deepserve.benchmarks.sim_dynamo import NOT_INSTALLED, dynamo_version, mocker_engine
from deepserve.cluster.te import kv_sizing

SMALL = ("--requests", "20", "--set", "cluster.tes=2")


def test_mocker_mirrors_the_scenarios_tes() -> None:
    """The comparable mocker run gets mooncake-16te's block size, HBM pool, DRAM tier and batch
    limits (the numbers docs/sim.md cites); the default-KV run only the block size and features."""
    scenario = load_scenario("mooncake-16te")
    size = kv_sizing(scenario.cluster)
    engine = mocker_engine(scenario, "cluster")
    assert engine["block_size"] == 512
    assert engine["num_gpu_blocks"] == size.hbm_blocks == 618
    assert engine["native_host_offload"] == {"num_host_blocks": size.dram_blocks}
    assert size.dram_blocks == 1907  # 128 GB of 64 MiB blocks (Llama-3-8B: 128 KiB a token)
    assert engine["kv_cache_bytes_per_token"] == 131072
    assert (engine["max_num_seqs"], engine["max_num_batched_tokens"]) == (256, 8192)
    assert engine["enable_prefix_caching"] and engine["enable_chunked_prefill"]
    assert "native_host_offload" not in mocker_engine(scenario, "hbm")
    assert mocker_engine(scenario, "default") == {
        "block_size": 512, "enable_prefix_caching": True, "enable_chunked_prefill": True}


def test_pd_cluster_refused(tmp_path: Path) -> None:
    res = in_process("bench", "sim", "--dynamo", "--set", "cluster.mode=pd", cwd=tmp_path)
    assert_one_line_error(res, "cluster.mode", "colocated")


def test_rounds_only_with_dynamo(tmp_path: Path) -> None:
    assert_one_line_error(in_process("bench", "sim", "--rounds", "2", cwd=tmp_path), "--rounds", "--dynamo")


def test_without_dynamo_one_line_and_deepserves_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_dynamo, "dynamo_version", lambda: None)
    res = in_process("bench", "sim", "--dynamo", "--json", *SMALL, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [NOT_INSTALLED]
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert rows["requests"]["value"] == 20 and rows["requests"]["baseline"] is None
    assert rows["sim_wall_s"]["value"] > rows["sim_wall_s_in_process"]["value"] > 0
    assert not any(name.startswith("dynamo_") for name in rows)


@pytest.mark.skipif(dynamo_version() is None, reason="the optional extra `dynamo` is not installed")
def test_side_by_side_with_the_mocker(tmp_path: Path) -> None:
    res = deepserve("bench", "sim", "--dynamo", "--json", *SMALL, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    walls = {r["baseline"]: r["baseline_value"] for r in rows if r["name"] == "sim_wall_s"}
    assert walls.keys() == {"dynamo_mocker_wall_s", "dynamo_mocker_wall_s_hbm_only",
                            "dynamo_mocker_wall_s_default_kv"}  # fmt: skip
    assert all(wall > 0 for wall in walls.values())
    cpus = {r["baseline"]: r["baseline_value"] for r in rows if r["name"] == "sim_cpu_s"}
    assert cpus.keys() == {f"dynamo_mocker_cpu_s{suffix}" for suffix in ("", "_hbm_only", "_default_kv")}
    assert all(cpu > 0 for cpu in cpus.values())
    by_name = {r["name"]: r for r in rows}
    assert by_name["requests"]["value"] == by_name["requests"]["baseline_value"] == 20  # both completed all
    assert by_name["virtual_time_s"]["baseline_value"] > 0
    assert 0 <= by_name["prefix_hit_rate"]["baseline_value"] <= 1
