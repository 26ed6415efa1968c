"""The performance model against published figures.

The efficiency factors were fitted once, globally (calibration.py); nothing here tunes anything.
Tolerances are the ones the issue sets. docs/perf-model.md tabulates the measured values.
"""

import statistics

import pytest

from deepserve.adapters.hardware.batch import Parallel, decode_batch
from deepserve.adapters.hardware.compute import forward_time
from deepserve.adapters.hardware.loading import (
    TENSOR_INIT_S,
    dram_cached_models,
    local_load,
    npu_fork,
    theoretical_dram_load_s,
)
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.moe import moe_layer_cost
from deepserve.adapters.hardware.mtp import mtp_decode_iteration
from deepserve.adapters.hardware.sizes import moe_layers
from deepserve.adapters.hardware.specs import link_spec, npu_spec, server_spec
from deepserve.adapters.hardware.stragglers import MAX_OVER_MIN, sample_barrier_latencies_s
from deepserve.adapters.hardware.transfer import ub_best_send_time_s, ub_send_time_s

MB = 1024 * 1024

# xDeepServe §7.1: DP288/EP288 on 288 910C dies; 256 dies host a routed + a redundant expert,
# 32 dies a shared + a redundant expert; batch 60 per die, ~3K context, one MTP layer, INT8.
DEEPSEEK = model_profile("deepseek-r1")
DIE = npu_spec("910c")
EP288 = Parallel(tp=1, dp=288, ep=288, shared_expert_ranks=32, redundant_experts=256)
BATCH_PER_DIE = 60
CONTEXT = 3072


@pytest.fixture(scope="module")
def iteration():
    return mtp_decode_iteration(
        DEEPSEEK, DIE, batch_size=BATCH_PER_DIE, context_tokens=CONTEXT, par=EP288,
        acceptance=0.9, gap_s=2e-3,
    )  # fmt: skip


def test_deepseek_decode_iteration_is_93_ms(iteration):
    assert iteration.iteration_s == pytest.approx(93e-3, rel=0.15)


def test_deepseek_tpot_is_50_ms(iteration):
    assert iteration.tpot_s == pytest.approx(50e-3, rel=0.15)


def test_deepseek_throughput_is_2400_tokens_per_chip(iteration):
    per_chip = iteration.tokens_per_s * DIE.dies_per_chip
    assert per_chip == pytest.approx(2400, rel=0.15)


def _main_and_mtp():
    batch = decode_batch(BATCH_PER_DIE, CONTEXT, tokens_per_seq=2)
    return forward_time(DEEPSEEK, DIE, batch, EP288), forward_time(
        DEEPSEEK, DIE, batch, EP288, part="mtp"
    )


def test_attention_and_all_to_all_shares_of_the_iteration(iteration):
    # Fig. 20 text: attention kernel 21.8 %, dispatch + combine "about 36 %".
    main, mtp = _main_and_mtp()
    attention = (main.attention_s + mtp.attention_s) / iteration.iteration_s
    a2a = (main.dispatch_s + main.combine_s + mtp.dispatch_s + mtp.combine_s)
    assert attention == pytest.approx(0.218, rel=0.2)
    assert a2a / iteration.iteration_s == pytest.approx(0.36, rel=0.2)


def test_fig20_average_dispatch_and_combine():
    main, _ = _main_and_mtp()
    layers = moe_layers(DEEPSEEK)
    assert main.dispatch_s / layers == pytest.approx(234e-6, rel=0.30)
    assert main.combine_s / layers == pytest.approx(312e-6, rel=0.30)


def test_fig20_sampled_barriers_average_right_and_spread_up_to_10x():
    main, _ = _main_and_mtp()
    cost = moe_layer_cost(DEEPSEEK, DIE, EP288, 2 * BATCH_PER_DIE, 0.0, link_spec("ub"))
    layers = moe_layers(DEEPSEEK)
    per_layer = {"dispatch": main.dispatch_s / layers, "combine": main.combine_s / layers}
    bases = {"dispatch": cost.dispatch_base_s, "combine": cost.combine_base_s}
    targets = {"dispatch": 234e-6, "combine": 312e-6}
    for seed, op in enumerate(("dispatch", "combine")):
        mean_wait = per_layer[op] - bases[op]
        # 20 iterations x (58 main + 1 MTP) MoE layers
        samples = sample_barrier_latencies_s(bases[op], mean_wait, 20 * (layers + 1), seed)
        assert statistics.fmean(samples) == pytest.approx(targets[op], rel=0.30)
        assert 3 < max(samples) / min(samples) <= MAX_OVER_MIN


def test_ub_send_recv_under_1_mb_on_2_cores_is_under_20_us():
    ub = link_spec("ub")
    assert ub_best_send_time_s(1 * MB, 2, ub) < 20e-6
    assert ub_send_time_s(1 * MB, 2, ub, semantic="memory") < 20e-6
    # and 9 MB over all 48 cores is more than 2.5x faster than over 2 (xDeepServe §3.1)
    ratio = ub_send_time_s(9 * MB, 2, ub) / ub_send_time_s(9 * MB, 48, ub)
    assert ratio > 2.5


GEN1 = server_spec("gen1-910b")


def test_dram_hit_is_weights_over_pcie_plus_tensor_init():
    m = model_profile("llama3-8b")  # TP1: a single loader, no PCIe contention
    expected = theoretical_dram_load_s(m, GEN1, 1) + TENSOR_INIT_S
    assert local_load(m, GEN1, 1, dram_hit=True).seconds == pytest.approx(expected, rel=0.20)


def test_dram_holds_about_ten_70b_or_a_hundred_7b_models():
    assert dram_cached_models(model_profile("llama3-70b"), GEN1) == pytest.approx(10, rel=0.2)
    assert dram_cached_models(model_profile("llama2-7b"), GEN1) == pytest.approx(100, rel=0.2)


# Fig. 10's three models load roughly the same bytes per NPU at growing TP.
FIG10 = (("llama3-8b", 1), ("codellama-34b", 4), ("llama3-70b", 8))


def test_npu_fork_over_hccs_beats_roce():
    for name, tp in FIG10:
        m = model_profile(name)
        hccs = npu_fork(m, link_spec("hccs"), tp).seconds
        assert hccs < npu_fork(m, link_spec("roce"), tp).seconds


def test_local_loading_slows_as_more_tp_ranks_share_pcie():
    times = [local_load(model_profile(n), GEN1, tp, dram_hit=True).seconds for n, tp in FIG10]
    assert times == sorted(times) and times[0] < times[-1]
    fork = [npu_fork(model_profile(n), link_spec("hccs"), tp).seconds for n, tp in FIG10]
    assert max(fork) / min(fork) < 1.2  # NPU-fork: separate links, no such contention


def test_broadcast_npu_fork_to_32_costs_little_more_than_to_one():
    m = model_profile("llama3-8b")  # Fig. 11: Llama3-8B TP1 over HCCS
    one = npu_fork(m, link_spec("hccs"), 1, targets=1).seconds
    many = npu_fork(m, link_spec("hccs"), 1, targets=32).seconds
    assert one < many < 1.1 * one
