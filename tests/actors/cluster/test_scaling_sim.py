"""Fast scaling (issue 34 §1–§4, DeepServe §6) under SimDriver: the five steps recorded with
their durations, pre-warmed pod and TE pools (fixed and predicted), DRAM pre-loading with hit and
miss per scale-out, NPU-fork (HCCS inside the source's server, RoCE beyond, sharing the fabric
with the source's own traffic), a replacement forked from a running TE, and 64 TEs in seconds."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.cluster.messages import PoolsQuery, PoolsStatus, PreloadModel, ScaleGroup
from deepserve.actors.cluster.prewarm import STEPS, Scaling, breakdown
from deepserve.actors.ports.faults import LinkDown
from deepserve.actors.ports.link import LinkTransfer
from deepserve.actors.ports.pod import KillPod
from deepserve.adapters.hardware.loading import local_load
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.specs import server_spec
from deepserve.adapters.scenario.loader import ScenarioError
from deepserve.benchmarks.scaling import (
    MODEL,
    POD_CREATE_S,
    PREWARM,
    SCALE_AT_S,
    VARIANTS,
    run_scale_out,
)
from deepserve.cluster.assembly import assemble
from deepserve.cluster.config import load, validated
from deepserve.cluster.control import MANAGER_ADDR, PODS_ADDR, PRELOAD_ADDR
from deepserve.core import SimDriver
from deepserve.persistence.api import MemoryLog
from deepserve.persistence.memory import MemorySink
from deepserve.replay import verify


def details(r: dict[str, Any], step: str = "te_load") -> dict[str, str]:
    st = r["driver"].actor(MANAGER_ADDR).state
    return {te: rec.details.get(step, "") for te, rec in st.tes.items() if rec.launched_s >= SCALE_AT_S}


def test_64_tes_prewarmed_and_forked_in_seconds_cold_waits_one_ssd_read_per_server() -> None:
    fork, cold = run_scale_out(VARIANTS["prewarm_fork"]), run_scale_out(VARIANTS["cold"])
    assert fork["ready"] == cold["ready"] == 64
    assert fork["scale_out_s"] < 3.0, fork["step_means_s"]
    assert cold["scale_out_s"] > 3 * fork["scale_out_s"], cold["step_means_s"]
    # where the time went: every step recorded, the cold one dominated by TE-Pre-Load and TE-Load
    f, c = fork["step_means_s"], cold["step_means_s"]
    assert set(STEPS) <= set(f) and f["te_post_load"] > 0  # the dummy request's forward pass
    assert f["scaler_pre"] == pytest.approx(0.1) and f["te_pre_load"] == pytest.approx(0.2)
    assert c["scaler_pre"] == pytest.approx(POD_CREATE_S) and c["te_pre_load"] == pytest.approx(Scaling().cold_pre_load_s())
    # Each server's page cache reads the file once for all its booting TEs (shared reads): a
    # cold TE-Load is one TP1 miss alone, not eight of them through one SSD.
    one_miss = local_load(model_profile(MODEL), server_spec("gen1-910b"), 1, dram_hit=False)
    assert c["te_load"] == pytest.approx(one_miss.seconds, rel=1e-6)
    assert c["te_load"] > f["te_load"]
    # 7 new TEs share the source's server (an HCCS broadcast), 57 are beyond it (RoCE)
    assert fork["te_load_paths"] == {"npu-fork-hccs": 7, "npu-fork-roce": 57}
    # 64 new TEs on 9 servers (7 beside te/0, 8 x 7, 1): one reads, the others join its read
    assert cold["te_load_paths"] == {"dram-miss": 9, "dram-miss-shared": 55}
    assert all(d.endswith("from te/0 (fork0)") for d in details(fork).values())


def test_pools_are_taken_then_refilled_after_their_cold_start() -> None:
    r = run_scale_out({"enabled": True, "pod_pool": 3, "executor_pool_per_server": 8, "master_pool": 5}, new_tes=8)
    pre = details(r, "scaler_pre")
    assert sorted(pre.values()).count("pre-warmed pod") == 3 and list(pre.values()).count("pod created") == 5
    warm = [d for d in details(r, "te_pre_load").values() if d.startswith("pre-warmed")]
    assert len(warm) == 5  # five masters: the sixth TE on the server starts cold
    pods = r["driver"].actor(PODS_ADDR).state
    assert (pods.pools.pods, pods.pools.masters) == (3, 5)  # back to the fixed sizes
    assert pods.pools.executors["0"] == 8


def test_predicted_pool_grows_to_the_last_windows_demand() -> None:
    r = run_scale_out({"enabled": True, "pod_pool": 2, "pool_policy": "predicted", "pool_max": 6}, new_tes=8)
    assert r["driver"].actor(PODS_ADDR).state.pools.pods == 6  # 8 wanted in the window, capped by pool_max
    r = run_scale_out({"enabled": True, "pod_pool": 2, "pool_policy": "predicted"}, new_tes=8)
    assert r["driver"].actor(PODS_ADDR).state.pools.pods == 8  # 2 taken, 6 created: the demand was 8
    r = run_scale_out({"enabled": True, "pod_pool": 2}, new_tes=8)
    assert r["driver"].actor(PODS_ADDR).state.pools.pods == 2  # fixed: back to its size


def test_dram_preload_makes_the_predicted_hosts_hits_and_scale_out_prefers_them() -> None:
    cfg = {**PREWARM, "dram_preload": "spare", "dram_preload_servers": 1}
    # spare slots: te/1..7 on server 0 (te/0 runs there), te/8..15 on server 1 — the most room
    r = run_scale_out(cfg, new_tes=15)
    assert r["driver"].actor(PRELOAD_ADDR).state.asked == {"hw/s1/host|llama3-8b": "loaded"}
    # server 0's seven misses: one reads the file, six join its read (shared reads)
    assert r["te_load_paths"] == {"dram-hit": 8, "dram-miss": 1, "dram-miss-shared": 6}
    # a scale-out of 8 takes the pre-loaded server's slots first, not te/1..8: all hits
    small = run_scale_out(cfg, new_tes=15, size=8)
    assert small["te_load_paths"] == {"dram-hit": 8}
    assert sorted(details(small)) == [f"te/{i}" for i in sorted(range(8, 16), key=str)]
    # without the pre-load the same scale-out takes te/1..8 and misses
    miss = run_scale_out(PREWARM, new_tes=15, size=8)
    assert miss["te_load_paths"] == {"dram-miss": 2, "dram-miss-shared": 6} and "te/1" in details(miss)


def test_fork_shares_the_fabric_with_the_source_tes_own_traffic() -> None:
    cfg = VARIANTS["prewarm_fork"]
    alone = run_scale_out(cfg, new_tes=8)

    def busy_source(d: SimDriver) -> None:  # the source's RoCE port already streams 20 GB
        d.inject("hw/fabric", LinkTransfer(req_id="kv", src="hw/s0/npu0", dst="hw/s1/npu7", nbytes=20 * 10**9,
                                           via="roce"), at=SCALE_AT_S, src="ext/test")  # fmt: skip

    shared = run_scale_out(cfg, new_tes=8, setup=busy_source)
    roce_alone, roce_shared = alone["per_te"]["te/8"]["te_load"], shared["per_te"]["te/8"]["te_load"]
    assert details(alone)["te/8"].startswith("npu-fork-roce")
    assert roce_shared > 1.3 * roce_alone  # the source's RoCE port is shared max-min fairly
    hccs = [te for te, d in details(shared).items() if d.startswith("npu-fork-hccs")]
    assert shared["per_te"][hccs[0]]["te_load"] == pytest.approx(alone["per_te"][hccs[0]]["te_load"])


def test_a_replacement_is_forked_from_a_running_te_and_the_run_replays() -> None:
    cfg = validated({"name": "replace", "log": "none",
                     "cluster": {"model": "llama3-8b", "tp": 1, "tes": 2, "npu_variance": False},
                     "control": {"heartbeat_interval_s": 0.5, "spare_tes": 0},
                     "scaling": {**PREWARM, "fork": True}})  # fmt: skip
    d = SimDriver(1, sink=MemorySink())
    assemble(d, cfg)
    d.inject(PODS_ADDR, KillPod(te="te/1"), at=2.0, src="ext/fault")
    d.run(until=20.0)
    rec = d.actor(MANAGER_ADDR).state.tes["te/1"]
    assert (rec.generation, rec.state) == (2, "ready")
    assert rec.source == "fork" and rec.details["te_load"].startswith("npu-fork-hccs from te/0")
    assert breakdown(d.actor(MANAGER_ADDR).state.tes)["tes"] == 1
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_scaling_from_zero_has_no_source_and_loads_from_the_host() -> None:
    cfg = validated({"name": "zero", "log": "none",
                     "cluster": {"model": "llama3-8b", "tp": 1, "tes": 1, "npu_variance": False},
                     "control": {"heartbeats": False, "spare_tes": 2},
                     "scaling": {**PREWARM, "fork": True}})  # fmt: skip
    d = SimDriver(0, sink=MemorySink())
    assemble(d, cfg)
    d.inject(MANAGER_ADDR, ScaleGroup(group="llama3-8b/colocated", size=0), at=1.0, src="ext/test")  # to zero
    d.inject(MANAGER_ADDR, ScaleGroup(group="llama3-8b/colocated", size=2), at=10.0, src="ext/test")
    d.run(until=60.0)
    st = d.actor(MANAGER_ADDR).state
    assert st.tes["te/0"].history[-1]["state"] == "stopped"  # drained to zero, its slot used again
    new = [r for r in st.tes.values() if r.launched_s >= 10.0]
    assert len(new) == 2 and all(r.state == "ready" for r in new)
    assert all("no fork: no running TE of llama3-8b" in r.details["te_load"] for r in new)


def test_a_bad_scaling_setting_names_its_key() -> None:
    with pytest.raises(ScenarioError, match=r"scaling\.pod_pool"):
        load("incident-prefill-crash", ["scaling.pod_pool=-1"])
    with pytest.raises(ScenarioError, match=r"scaling\.pool_policy"):
        load("incident-prefill-crash", ["scaling.pool_policy=sometimes"])
    with pytest.raises(ScenarioError, match=r"scaling\.fork: set scaling\.enabled = true too"):
        load("incident-prefill-crash", ["scaling.fork=true"])
    with pytest.raises(ScenarioError, match=r"scaling\.executor_pool_per_server: at most the 8 910b NPUs"):
        load("incident-prefill-crash", ["scaling.enabled=true", "scaling.executor_pool_per_server=9"])


def test_pre_warmed_tes_are_packed_per_parallelism_and_forked_rank_by_rank() -> None:
    # TP2 TEs: te/0 runs on s0's NPUs 0-1; te/1..3 take 2 pre-warmed executors each while 5 last
    r = run_scale_out({"enabled": True, "executor_pool_per_server": 5, "master_pool": 8, "fork": True},
                      new_tes=3, tp=2)  # fmt: skip
    pre = details(r, "te_pre_load")
    assert pre["te/1"].startswith("pre-warmed: 2 executor(s) + 1 master(s)") and pre["te/2"].startswith("pre-warmed")
    assert pre["te/3"].startswith("cold")  # one executor left on the server: not enough for TP2
    assert r["te_load_paths"] == {"npu-fork-hccs": 3} and r["ready"] == 3


def test_a_later_prediction_preloads_the_hosts_it_names() -> None:
    def predict(d: SimDriver) -> None:
        d.inject(PRELOAD_ADDR, PreloadModel(model="llama3-8b", hosts=("hw/s0/host",), reason="test"), at=1.0,
                 src="ext/autoscaler")  # fmt: skip

    r = run_scale_out(PREWARM, new_tes=7, setup=predict)
    assert r["driver"].actor(PRELOAD_ADDR).state.asked == {"hw/s0/host|llama3-8b": "loaded"}
    assert r["te_load_paths"] == {"dram-hit": 7}


@pytest.mark.parametrize("masters", [1, 2])
def test_one_pool_of_pre_warmed_tes_serves_every_model(masters: int) -> None:
    """Llama-3-8B scales out at t=1 while Llama-2-7B's TE is killed and replaced: both take
    from the same pools (the pre-warmed masters are model-agnostic)."""
    cfg = validated({"name": "two-models", "log": "none",
                     "cluster": {"model": "llama3-8b", "tp": 1, "tes": 1, "npu_variance": False},
                     "groups": [{"model": "llama2-7b", "tp": 1, "tes": 1, "npu_variance": False}],
                     "control": {"heartbeat_interval_s": 0.5, "spare_tes": 1},
                     "scaling": {"enabled": True, "pod_pool": 2, "executor_pool_per_server": 8,
                                 "master_pool": masters}})  # fmt: skip
    d = SimDriver(2, sink=MemorySink())
    assemble(d, cfg)
    d.inject(MANAGER_ADDR, ScaleGroup(group="llama3-8b/colocated", size=2), at=1.0, src="ext/test")
    d.inject(PODS_ADDR, KillPod(te="te/2"), at=1.0, src="ext/fault")
    d.run(until=30.0)
    tes = d.actor(MANAGER_ADDR).state.tes
    assert tes["te/1"].state == "ready" and (tes["te/2"].generation, tes["te/2"].state) == (2, "ready")
    assert tes["te/1"].details["te_pre_load"].startswith("pre-warmed")  # first: t=1
    replacement = tes["te/2"].details["te_pre_load"]  # after the heartbeats' misses: the last master is gone
    assert replacement.startswith("pre-warmed" if masters == 2 else "cold"), replacement
    assert tes["te/2"].details["scaler_pre"] == "pre-warmed pod"


def test_the_fork_source_shares_the_replacements_hccs_domain_when_one_can() -> None:
    cfg = validated({"name": "near", "log": "none",
                     "cluster": {"model": "llama3-8b", "tp": 1, "tes": 10, "npu_variance": False},
                     "control": {"heartbeat_interval_s": 0.5, "spare_tes": 0},
                     "scaling": {"enabled": True, "fork": True}})  # fmt: skip
    d = SimDriver(4, sink=MemorySink())
    assemble(d, cfg)
    d.inject(PODS_ADDR, KillPod(te="te/9"), at=1.0, src="ext/fault")  # te/8 and te/9 share server 1
    d.run(until=30.0)
    rec = d.actor(MANAGER_ADDR).state.tes["te/9"]
    assert (rec.generation, rec.state) == (2, "ready")
    assert rec.details["te_load"].startswith("npu-fork-hccs from te/8"), rec.details["te_load"]


def test_the_launcher_answers_what_its_pools_hold() -> None:
    r = run_scale_out({"enabled": True, "pod_pool": 3, "executor_pool_per_server": 2, "master_pool": 1}, new_tes=2)
    d = r["driver"]
    got: list[Any] = []
    d.on_external = lambda _t, env: got.append(env.msg)
    d.inject(PODS_ADDR, PoolsQuery(req_id="q"), at=d.now + 1.0, src="ext/status")
    d.run(until=d.now + 2.0)
    (st,) = [m for m in got if isinstance(m, PoolsStatus)]
    assert (st.enabled, st.pods, st.masters, st.executors, st.policy) == (True, 3, 1, {"0": 2}, "fixed")
    off = run_scale_out({}, new_tes=1)["driver"]
    off.on_external = lambda _t, env: got.append(env.msg)
    off.inject(PODS_ADDR, PoolsQuery(req_id="q2"), at=off.now + 1.0, src="ext/status")
    off.run(until=off.now + 2.0)
    assert [m.enabled for m in got if isinstance(m, PoolsStatus) and m.req_id == "q2"] == [False]


def test_a_broadcast_cut_by_a_link_fault_falls_back_to_the_host() -> None:
    def cut(d: SimDriver) -> None:  # the source's RoCE port goes down while it streams
        d.inject("hw/fabric", LinkDown(link="s0/npu0/roce"), at=SCALE_AT_S + 0.6, src="ext/fault")

    r = run_scale_out(VARIANTS["prewarm_fork"], new_tes=8, setup=cut)
    got = details(r)
    assert r["ready"] == 8 and r["te_load_paths"] == {"npu-fork-hccs": 7, "dram-miss": 1}
    assert got["te/8"].startswith("dram-miss (ssd); no fork: NPU-fork over roce from te/0 failed"), got["te/8"]
