"""A simulation split by server across worker processes (deepserve/cluster/parallel.py): the
partition plan, and the split run's per-request results against the whole run's, bit for bit."""

from __future__ import annotations

import pytest

from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.scenario.loader import load_scenario
from deepserve.adapters.scenario.partition import ParallelError, plan_partitions, selector
from deepserve.cluster.parallel import run_parallel
from deepserve.cluster.run import run_scenario


def _servers(workers: int, *overrides: str) -> list[tuple[int, ...]]:
    return [p.servers for p in plan_partitions(load_scenario("mooncake-16te", list(overrides)), workers)]


def test_servers_are_grouped_contiguously_by_about_equal_te_counts() -> None:
    assert _servers(2) == [(0,), (1,)]  # 16 TEs, 8 a server
    assert _servers(1) == [(0, 1)]
    assert _servers(8) == [(0,), (1,)]  # never more workers than servers
    assert _servers(2, "cluster.tes=20") == [(0,), (1, 2)]  # 8 | 8 + 4, not 16 | 4
    assert _servers(3, "cluster.tes=32") == [(0,), (1, 2), (3,)]
    assert _servers(2, "cluster.tes=4") == [(0,)]  # one server: nothing to split
    parts = plan_partitions(load_scenario("mooncake-16te"), 2)
    assert parts[1].tes == tuple(f"te/{i}" for i in range(8, 16)) and parts[1].of == 2


def test_what_cannot_be_split_is_refused_with_the_reason() -> None:
    with pytest.raises(ParallelError, match="pd scenario's KV crosses servers"):
        plan_partitions(load_scenario("pd-1p1d"), 2)
    assert len(plan_partitions(load_scenario("pd-1p1d"), 1)) == 1  # one worker is the whole run


def test_a_partition_gets_the_requests_the_whole_runs_round_robin_gives_its_tes() -> None:
    sc = load_scenario("mooncake-16te", ["cluster.tes=20"])
    first, second = plan_partitions(sc, 2)
    mine = selector(sc, first)
    assert [k for k in range(45) if mine(k)] == [*range(8), *range(20, 28), *range(40, 45)]
    other = selector(sc, second)
    assert all(mine(k) != other(k) for k in range(100))


def _by_id(done: list[RequestDone]) -> list[RequestDone]:
    return sorted(done, key=lambda d: d.request_id)


@pytest.mark.parametrize("overrides", [[], ["cluster.kv_dram_gb=2", "cluster.scheduler.kv_blocks=600"]],
                         ids=["default", "dram-tier-under-pressure"])  # fmt: skip
def test_the_split_run_gives_every_request_the_whole_runs_result_bit_for_bit(overrides: list[str]) -> None:
    sc = load_scenario("mooncake-16te", ["workload.trace=builtin:mooncake_conv_1k", "workload.rps_scale=4",
                                         *overrides])  # fmt: skip
    whole: list[RequestDone] = []
    w = run_scenario(sc, requests=400, on_done=whole.append)
    split: list[RequestDone] = []
    progress: list[int] = []
    s = run_parallel(sc, plan_partitions(sc, 2), trace=sc.workload.trace, requests=400, logs=None,
                     on_progress=progress.append, on_done=split.append)  # fmt: skip
    assert len(whole) == 400 and w.summary["completed"] == 400
    assert _by_id(split) == _by_id(whole)  # every field of every request: times, tokens, TE
    assert s.summary == w.summary and s.workload == w.workload and s.injected == 400
    assert sum(progress) == 400
    assert {d.te for d in split} == {f"te/{i}" for i in range(16)}  # both servers served


def test_the_dram_tier_case_moves_kv_through_the_fabric() -> None:
    # What the second case above exercises: DRAM-tier copies are fabric transfers (165 with
    # the default pool, 948 with a 600-block one, at this seed and slice: the run ends with its
    # last request, cluster/run.py `drain`, one swap-out still on the fabric then).
    sc = load_scenario("mooncake-16te", ["workload.trace=builtin:mooncake_conv_1k", "workload.rps_scale=4",
                                         "cluster.kv_dram_gb=2", "cluster.scheduler.kv_blocks=600"])  # fmt: skip
    seen: dict[str, int] = {}
    run_scenario(sc, requests=400, on_end=lambda d: seen.update(n=d.actor("hw/fabric").state.delivered))
    assert seen["n"] == 948


def test_a_worker_given_no_request_still_starts_its_part_and_the_merge_is_the_whole_run() -> None:
    sc = load_scenario("mooncake-16te", ["workload.trace=builtin:mooncake_conv_1k"])
    whole = run_scenario(sc, requests=1)
    split = run_parallel(sc, plan_partitions(sc, 2), trace=sc.workload.trace, requests=1, logs=None)
    assert split.summary == whole.summary and split.summary["completed"] == 1
    assert split.workload == whole.workload and split.injected == 1
