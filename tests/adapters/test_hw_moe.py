"""MoE barriers (expected values) and the seeded straggler / routing distributions."""

import random
import statistics

import pytest

from deepserve.adapters.hardware.batch import Parallel
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.moe import (
    NATIVE_HOT_EXPERT_RATIO,
    expected_max_z,
    hot_rank_ratio,
    moe_layer_cost,
    touched_fraction,
)
from deepserve.adapters.hardware.specs import link_spec, npu_spec
from deepserve.adapters.hardware.stragglers import (
    MAX_OVER_MIN,
    eplb_placement,
    expert_loads,
    hot_ratio,
    rank_loads,
    sample_barrier_latencies_s,
    sample_expert_popularity,
)

DEEPSEEK = model_profile("deepseek-r1")
DIE = npu_spec("910c")
UB = link_spec("ub")


def test_expected_max_z():
    assert expected_max_z(1) == 0.0
    zs = [expected_max_z(n) for n in (2, 8, 64, 288)]
    assert zs == sorted(zs)
    assert 2.5 < expected_max_z(288) < 3.2


def test_hot_rank_ratio_native_and_balanced():
    assert hot_rank_ratio(1, eplb=False) == NATIVE_HOT_EXPERT_RATIO
    assert hot_rank_ratio(8, eplb=False) == pytest.approx(1 + 29 / 8)
    assert 1 < hot_rank_ratio(2, eplb=True) < hot_rank_ratio(2, eplb=False)


def test_small_batches_touch_few_experts():
    assert touched_fraction(DEEPSEEK, 1) == pytest.approx(8 / 256)
    assert touched_fraction(DEEPSEEK, 10_000) == pytest.approx(1.0)


def test_waits_grow_with_the_slowest_participant():
    par = Parallel(dp=288, ep=288, shared_expert_ranks=32, redundant_experts=256)
    quick = moe_layer_cost(DEEPSEEK, DIE, par, 120, 100e-6, UB)
    slow = moe_layer_cost(DEEPSEEK, DIE, par, 120, 1000e-6, UB)
    assert slow.dispatch_s > quick.dispatch_s  # dispatch absorbs attention variance
    assert slow.combine_s == quick.combine_s
    assert quick.dispatch_s > quick.dispatch_base_s and quick.combine_s > quick.combine_base_s


def test_single_dp_group_has_no_dispatch_wait():
    cost = moe_layer_cost(DEEPSEEK, DIE, Parallel(tp=8, ep=8), 64, 1e-3, UB)
    assert cost.dispatch_s == cost.dispatch_base_s


def test_barrier_samples_are_deterministic_for_a_seed():
    a = sample_barrier_latencies_s(150e-6, 100e-6, 100, 7)
    assert a == sample_barrier_latencies_s(150e-6, 100e-6, 100, random.Random(7))
    assert a != sample_barrier_latencies_s(150e-6, 100e-6, 100, 8)


def test_barrier_samples_are_bounded_and_heavy_tailed():
    samples = sample_barrier_latencies_s(150e-6, 100e-6, 5000, 1)
    assert min(samples) >= 150e-6
    assert max(samples) <= 150e-6 * MAX_OVER_MIN + 1e-15
    assert statistics.fmean(samples) == pytest.approx(250e-6, rel=0.05)
    assert max(samples) / min(samples) > 5


def test_expert_popularity_is_skewed_like_fig_11a():
    # Fig. 11a: ~20 % of experts above average, the hottest ~30x the average.
    hottest, above = [], []
    for seed in range(40):
        shares = sample_expert_popularity(256, seed)
        assert sum(shares) == pytest.approx(1.0)
        hottest.append(max(shares) * 256)
        above.append(sum(s > 1 / 256 for s in shares) / 256)
    assert 15 < statistics.median(hottest) < 60
    assert 0.15 < statistics.fmean(above) < 0.25


def test_eplb_placement_balances_ranks():
    loads = expert_loads(34_560, sample_expert_popularity(256, 3), 8)
    native = rank_loads(loads, tuple((e,) for e in range(256)))
    placement = eplb_placement(loads, 256, 2)
    assert sum(len(rank) for rank in placement) == 512
    assert set(e for rank in placement for e in rank) == set(range(256))
    balanced = rank_loads(loads, placement)
    assert sum(balanced) == pytest.approx(sum(loads))
    assert hot_ratio(native) > 10
    assert hot_ratio(balanced) < 1.5


def test_eplb_input_errors():
    with pytest.raises(ValueError, match="^slots_per_rank: "):
        eplb_placement((1.0, 2.0, 3.0), 1, 2)
    with pytest.raises(ValueError, match="^placement: "):
        rank_loads((1.0, 2.0), ((0,),))
