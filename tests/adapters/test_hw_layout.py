"""Layouts the hardware cannot hold are refused; collectives are priced on the links they span;
MoE imbalance depends on the tokens routed per step."""

import pytest

from deepserve.adapters.hardware.batch import Parallel, decode_batch, prefill_batch
from deepserve.adapters.hardware.compute import forward_time
from deepserve.adapters.hardware.layout import Span, cluster_for, span_for
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.moe import (
    EPLB_HOT_RATIO,
    a2a_base_s,
    expected_max_z,
    hot_rank_ratio,
    moe_layer_cost,
)
from deepserve.adapters.hardware.predict import predict
from deepserve.adapters.hardware.specs import link_spec, npu_spec

DEEPSEEK = model_profile("deepseek-v3")
B910 = npu_spec("910b")
DIE = npu_spec("910c")
HCCS, ROCE, UB = link_spec("hccs"), link_spec("roce"), link_spec("ub")
ONE = dict(batch_sizes=(1,), context_tokens=(1024,))


# ---- refusals ----------------------------------------------------------------------------
def test_more_dies_than_a_cloudmatrix384_has_are_refused():
    with pytest.raises(ValueError) as info:
        predict("deepseek-r1", "910c", 1, dp=2000, ep=2000, **ONE)
    msg = str(info.value)
    assert msg.startswith("dp: DP2000 x TP1 x PP1 = 2000 NPUs exceeds the 768 910c dies")
    assert "DeepServe §2" in msg


def test_dp288_on_a_64_npu_gen1_cluster_is_refused_unless_it_has_the_servers():
    with pytest.raises(ValueError, match=r"^dp: .* 288 NPUs exceeds the 64 910b NPUs of the gen1"):
        predict("deepseek-r1", "910b", 1, dp=288, ep=288, redundant_experts=32, **ONE)
    p = predict("deepseek-r1", "910b", 1, dp=288, ep=288, redundant_experts=32, servers=36, **ONE)
    assert p.servers == 36
    with pytest.raises(ValueError, match="^servers: a cm384 cluster has 1 to 48 servers"):
        predict("llama3-8b", "910c", 1, servers=49, **ONE)


def test_ep_wider_than_experts_plus_replicas_is_refused_by_the_model_itself():
    with pytest.raises(ValueError, match="^ep: 512 routed-expert ranks .* 256 routed experts"):
        predict("deepseek-r1", "910c", 1, dp=512, ep=512, **ONE)
    with pytest.raises(ValueError, match="^ep: 288 routed-expert ranks"):
        forward_time(DEEPSEEK, DIE, decode_batch(1, 10), Parallel(dp=288, ep=288))
    # 32 shared-expert ranks, or 32 redundant replicas, give every rank something to run
    forward_time(DEEPSEEK, DIE, decode_batch(1, 10), Parallel(dp=288, ep=288,
                 shared_expert_ranks=32))  # fmt: skip
    forward_time(DEEPSEEK, DIE, decode_batch(1, 10), Parallel(dp=288, ep=288,
                 redundant_experts=32))  # fmt: skip


def test_npu_fork_broadcast_over_hccs_beyond_one_server_is_refused():
    fits = predict("llama3-8b", "910b", 1, fork_targets=7, **ONE)
    rows = {r.path: r for r in fits.loads}
    assert rows["npu-fork-hccs"].seconds is not None  # 1 source + 7 targets = one server
    wide = predict("llama3-8b", "910b", 1, fork_targets=32, **ONE)
    rows = {r.path: r for r in wide.loads}
    assert rows["npu-fork-hccs"].seconds is None
    assert rows["npu-fork-hccs"].refused.startswith(
        "npu-fork-hccs: 33 NPUs over hccs exceed one hccs domain of 8 NPUs"
    )
    assert rows["npu-fork-roce"].seconds is not None  # RoCE reaches every NPU


def test_ub_broadcast_spans_the_superpod_but_not_more():
    p = predict("llama3-8b", "910c", 1, fork_targets=767, **ONE)
    assert {r.path: r.seconds for r in p.loads}["npu-fork-ub"] is not None
    p = predict("llama3-8b", "910c", 1, fork_targets=768, **ONE)
    assert "exceed the 768 NPUs of the cluster" in {r.path: r.refused for r in p.loads}["npu-fork-ub"]


def test_cluster_must_match_the_npu():
    with pytest.raises(ValueError, match="^cluster: a cm384 cluster is built of 910c"):
        cluster_for(B910, "cm384")


# ---- collectives on the links they span --------------------------------------------------
def test_910b_tp8_dp4_ep32_all_to_all_crosses_roce():
    """TP8 x DP4 = 32 ranks on four 8-NPU servers: 24 of each rank's 31 peers are behind RoCE."""
    par = Parallel(tp=8, dp=4, ep=32)
    batch = decode_batch(8, 4096)
    spanned = forward_time(DEEPSEEK, B910, batch, par)
    all_hccs = forward_time(DEEPSEEK, B910, batch, par, link=HCCS)
    assert spanned.dispatch_s > all_hccs.dispatch_s
    assert spanned.combine_s > all_hccs.combine_s
    assert spanned.dispatch_s == forward_time(
        DEEPSEEK, B910, batch, par, link=Span(intra=HCCS, inter=ROCE, server_npus=8)
    ).dispatch_s
    # the same all-to-all inside one server stays on HCCS
    inside = Parallel(tp=8, ep=8)
    assert forward_time(DEEPSEEK, B910, batch, inside).dispatch_s == pytest.approx(
        forward_time(DEEPSEEK, B910, batch, inside, link=HCCS).dispatch_s
    )


def test_a2a_sends_remote_bytes_over_the_inter_link_and_pays_its_per_peer_cost():
    span = Span(intra=HCCS, inter=ROCE, server_npus=8)
    nbytes = 31e6  # 1 MB to each of 31 peers: 7 in the server, 24 behind RoCE
    expected = 2 * ROCE.latency_s + 7 * HCCS.per_message_s + 24 * ROCE.per_message_s
    expected += 24e6 / (ROCE.bw_bytes_per_s * ROCE.eff)  # RoCE is the slower half
    assert a2a_base_s(nbytes, 32, span) == pytest.approx(expected)
    # a single server: only HCCS, its 7 mesh links at once
    inside = 2 * HCCS.latency_s + 7 * HCCS.per_message_s + 7e6 / (7 * HCCS.bw_bytes_per_s * HCCS.eff)
    assert a2a_base_s(7e6, 8, span) == pytest.approx(inside)


def test_tp_all_reduce_wider_than_a_server_crosses_roce():
    m = model_profile("llama3-70b")
    batch = prefill_batch(1, 2048)
    wide = forward_time(m, B910, batch, Parallel(tp=16))
    on_hccs = forward_time(m, B910, batch, Parallel(tp=16), link=HCCS)
    on_roce = forward_time(m, B910, batch, Parallel(tp=16), link=ROCE)
    assert wide.collective_s == pytest.approx(on_roce.collective_s)
    assert wide.collective_s > on_hccs.collective_s


def test_cloudmatrix_collectives_stay_on_ub():
    par = Parallel(dp=288, ep=288, shared_expert_ranks=32, redundant_experts=256)
    batch = decode_batch(60, 3072, tokens_per_seq=2)
    assert span_for(DIE).intra == span_for(DIE).inter == UB
    assert forward_time(DEEPSEEK, DIE, batch, par).total_s == pytest.approx(
        forward_time(DEEPSEEK, DIE, batch, par, link=UB).total_s
    )


# ---- imbalance as a function of the tokens routed per step -------------------------------
def test_hot_ratio_falls_with_tokens_per_rank_to_the_persistent_part():
    ratios = [hot_rank_ratio(2, True, n, 256) for n in (1, 10, 100, 1_000, 100_000)]
    assert ratios == sorted(ratios, reverse=True)
    assert ratios[-1] == pytest.approx(EPLB_HOT_RATIO, abs=0.01)
    assert hot_rank_ratio(2, True, 100, 256) == pytest.approx(
        EPLB_HOT_RATIO + expected_max_z(256) / 10
    )


def test_prefill_is_not_charged_decode_imbalance():
    """A decode step of 8 sequences on EP32 routes ~2 token-expert pairs per rank: lumpy. A
    prefill of 4 x 4096 tokens routes ~4,000 per rank: only the persistent skew is left."""
    par = Parallel(tp=8, dp=4, ep=32, redundant_experts=32)
    span = span_for(B910)
    decode = moe_layer_cost(DEEPSEEK, B910, par, 8, 0.0, span)
    prefill = moe_layer_cost(DEEPSEEK, B910, par, 4 * 4096, 0.0, span)
    assert prefill.hot_ratio < decode.hot_ratio
    assert prefill.hot_ratio == pytest.approx(EPLB_HOT_RATIO, abs=0.05)
    assert decode.hot_ratio > EPLB_HOT_RATIO + 0.5


def test_forward_time_refuses_more_npus_than_any_cluster_of_the_kind_holds():
    m = model_profile("llama3-8b")
    with pytest.raises(ValueError, match="^dp: DP2000 x TP1 x PP1 = 2000 NPUs exceeds the 768"):
        forward_time(m, DIE, decode_batch(1, 1), Parallel(dp=2000))
    with pytest.raises(ValueError, match="^dp: .* 8192 910b NPUs of the gen1 cluster"):
        forward_time(m, B910, decode_batch(1, 1), Parallel(dp=8193))
    forward_time(m, DIE, decode_batch(1, 1), Parallel(dp=768))
