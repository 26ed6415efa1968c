"""Where a scenario's TEs go, and how big their KV pools are (pure functions)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.adapters.hardware.batch import Parallel
from deepserve.adapters.hardware.memory import kv_capacity_tokens
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.specs import npu_spec
from deepserve.adapters.scenario.loader import load_scenario
from deepserve.adapters.scenario.placement import place
from deepserve.cluster.te import kv_sizing, master_config


def test_mooncake_16te_fills_two_servers() -> None:
    p = place(load_scenario("mooncake-16te").cluster)
    assert p.servers == 2 and len(p.tes) == 16
    assert p.tes[0].npus == ("hw/s0/npu0",) and p.tes[15].npus == ("hw/s1/npu7",)
    assert p.role("colocated") == [f"te/{i}" for i in range(16)]


def test_pd_over_roce_puts_decode_on_another_server_hccs_does_not() -> None:
    roce = place(load_scenario("pd-1p1d").cluster)
    assert [(t.role, t.server) for t in roce.tes] == [("prefill", 0), ("decode", 1)]
    hccs = place(load_scenario("pd-1p1d", ["cluster.link=hccs"]).cluster)
    assert [(t.role, t.server) for t in hccs.tes] == [("prefill", 0), ("decode", 0)]
    assert hccs.tes[1].npus == ("hw/s0/npu1",)


@settings(max_examples=60, deadline=None)
@given(tes=st.integers(1, 40), tp=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2, 4]))
def test_tes_never_share_an_npu_nor_span_servers(tes: int, tp: int, dp: int) -> None:
    if tp * dp > 8:
        return
    c = load_scenario("mooncake-16te", [f"cluster.tes={tes}", f"cluster.tp={tp}",
                                        f"cluster.dp_groups={dp}"]).cluster  # fmt: skip
    p = place(c)
    npus = [n for t in p.tes for n in t.npus]
    assert len(npus) == len(set(npus)) == tes * tp * dp
    for t in p.tes:
        assert {n.split("/")[1] for n in t.npus} == {f"s{t.server}"}
    assert p.servers == max(t.server for t in p.tes) + 1


def test_kv_pool_is_hbm_after_weights_from_the_performance_model() -> None:
    c = load_scenario("mooncake-16te").cluster
    size = kv_sizing(c)
    expect = kv_capacity_tokens(model_profile("llama3-8b"), npu_spec("910b"), Parallel(tp=1)) // 512
    assert size.hbm_blocks == expect > 0
    assert size.dram_blocks == int(128e9 // size.kv_block_bytes)
    small = load_scenario("pd-1p1d", ["cluster.scheduler.decode_kv_blocks=48"])
    te = place(small.cluster).tes
    assert master_config(small, te[1], 0)["hbm_blocks"] == 48
    assert master_config(small, te[0], 0)["hbm_blocks"] > 48  # the prefill side keeps its HBM
