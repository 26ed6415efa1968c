"""The NPU's cheap per-run cost path gives the model's numbers: forward_time's cached dense
split equals the per-layer loop it replaced, bit for bit; the per-chunk variance stream has the
documented distribution and is deterministic."""

from __future__ import annotations

import math
import statistics
import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.adapters.hardware import compute
from deepserve.adapters.hardware.batch import Batch, Parallel, Seq, logits_tokens
from deepserve.adapters.hardware.calibration import DP_COMPUTE_CV
from deepserve.adapters.hardware.compute import ForwardCost, forward_time
from deepserve.adapters.hardware.devices.npu_draws import (
    factor_picks,
    factor_table,
    pass_starts,
    run_ends,
    truncation_point,
    variance_factors,
)
from deepserve.adapters.hardware.layout import span_for
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.specs import npu_spec
from deepserve.core.rng import DeliveryRng


def reference_forward_time(m, npu, batch, par, part="main") -> ForwardCost:
    """forward_time as it was before the dense split: every layer kind through `_layer`,
    per-field totals, `sum` over them (the MoE path still runs this loop)."""
    span = span_for(npu)
    totals = dict.fromkeys(compute._Layer.__struct_fields__, 0.0)
    ops = 0
    for is_moe, count in compute._layer_plan(m, part):
        if count == 0:
            continue
        layer = compute._layer(m, npu, batch, par, span, is_moe)
        for field in compute._Layer.__struct_fields__:
            totals[field] += count * getattr(layer, field)
        per_layer = compute.OPS_MOE_LAYER if is_moe else compute.OPS_DENSE_LAYER
        ops += count * (per_layer + (compute.OPS_MLA_EXTRA if m.mla else 0))
    head = compute.linear_time_s(
        compute.head_params(m) / par.tp, logits_tokens(batch), "bf16", npu,
        act_elems_per_token=m.hidden_size + m.vocab_size / par.tp,
    )  # fmt: skip
    stage_link = compute.group_link(par.tp * par.pp, span)
    stage_send = compute.transfer_time_s(batch.tokens * m.hidden_size * 2, stage_link)
    totals["collective_s"] += (par.pp - 1) * stage_send
    ops += compute.OPS_HEAD
    executed = sum(totals.values()) + head
    graph = compute.is_graph_batch(batch)
    fixed = npu.eff.forward_fixed_s + ops * npu.eff.kernel_overhead_s
    busy = executed if graph else max(executed, ops * npu.eff.single_op_launch_s)
    total = fixed + busy
    return ForwardCost(
        mode="graph" if graph else "single_op", head_s=head, launch_s=total - executed,
        total_s=total, **totals,
    )  # fmt: skip


BATCHES = [
    (Seq(1, 0),),
    (Seq(1, 100),),
    (Seq(1, 5000), Seq(1, 7), Seq(3, 100)),
    (Seq(1, 123_457),) * 64,
    (Seq(512, 0),),
    (Seq(2048, 300), Seq(1, 4000)),
]


@pytest.mark.parametrize(
    "model", ["llama2-7b", "llama3-8b", "llama2-13b", "llama3-70b", "qwen2-72b"]
)
@pytest.mark.parametrize("npu", ["910b", "910c"])
def test_the_dense_split_is_the_per_layer_loop(model: str, npu: str) -> None:
    m, spec = model_profile(model), npu_spec(npu)
    for tp in (1, 2, 4, 8):
        for pp in (1, 2):
            for seqs in BATCHES:
                batch, par = Batch(seqs), Parallel(tp=tp, pp=pp)
                new = msgspec.structs.astuple(forward_time(m, spec, batch, par))
                old = msgspec.structs.astuple(reference_forward_time(m, spec, batch, par))
                if sys.version_info < (3, 12):  # sum() of floats adds left to right
                    assert new == old, (tp, pp, seqs)
                else:  # 3.12's sum() compensates rounding: the loop's own floats move by ulps
                    assert new == pytest.approx(old, rel=1e-15), (tp, pp, seqs)


def test_the_cached_part_is_keyed_by_value() -> None:
    """A changed spec (the bandwidth properties build them) is a different cache key."""
    m, spec = model_profile("llama3-8b"), npu_spec("910b")
    faster = msgspec.structs.replace(spec, hbm_bw_bytes_per_s=2 * spec.hbm_bw_bytes_per_s)
    batch = Batch((Seq(1, 4096),) * 8)
    assert forward_time(m, faster, batch).total_s < forward_time(m, spec, batch).total_s
    assert forward_time(m, spec, batch) == forward_time(m, spec, batch)


def test_variance_factors_are_lognormal_with_mean_one_and_the_calibrated_cv() -> None:
    factors = variance_factors(DeliveryRng(7), 40_001).tolist()
    assert len(factors) == 40_001 and min(factors) > 0
    mean = statistics.fmean(factors)
    assert mean == pytest.approx(1.0, abs=4 * DP_COMPUTE_CV / math.sqrt(len(factors)))
    assert statistics.stdev(factors) / mean == pytest.approx(DP_COMPUTE_CV, rel=0.03)
    logs = [math.log(f) for f in factors]  # log-factors are normal: no skew
    sigma = math.sqrt(math.log1p(DP_COMPUTE_CV**2))
    skew = statistics.fmean(((x + sigma * sigma / 2) / sigma) ** 3 for x in logs)
    assert abs(skew) < 0.05


def test_the_factor_table_is_the_calibrated_lognormal_with_mean_exactly_one() -> None:
    table = factor_table().tolist()
    assert len(table) == 1 << 16 and table == sorted(table)
    mean = math.fsum(table) / len(table)
    assert mean == pytest.approx(1.0, abs=1e-15)
    cv = math.sqrt(math.fsum((x - mean) ** 2 for x in table) / len(table)) / mean
    assert cv == pytest.approx(DP_COMPUTE_CV, rel=1e-4)


def test_variance_factors_pick_quantiles_by_little_endian_16_bit_draws() -> None:
    """The picks are defined by the bytes, not by the machine's byte order: a log made on one
    machine replays on another. The bytes are SHAKE-128 of the 64-bit draw's 8 LE bytes."""
    import hashlib

    for k in (1, 5, 300):
        seed = DeliveryRng(5).getrandbits(64)
        raw = hashlib.shake_128(seed.to_bytes(8, "little")).digest(2 * k)
        picks = [int.from_bytes(raw[2 * i : 2 * i + 2], "little") for i in range(k)]
        assert factor_picks(seed, k).tolist() == picks
        want = [factor_table().tolist()[p] for p in picks]
        assert variance_factors(DeliveryRng(5), k).tolist() == want
    assert variance_factors(DeliveryRng(5), 0).tolist() == []


def test_variance_factors_are_deterministic_and_chunks_independent() -> None:
    a, b = DeliveryRng(11), DeliveryRng(11)
    assert variance_factors(a, 33).tolist() == variance_factors(b, 33).tolist()
    first, second = (
        variance_factors(a, 64).tolist(),
        variance_factors(a, 64).tolist(),
    )  # one draw each
    assert first != second
    assert (
        variance_factors(DeliveryRng(12), 33).tolist()
        != variance_factors(DeliveryRng(11), 33).tolist()
    )


def _stepwise_ends(
    gap: float, start: float, costs: list[float], factors: list[float] | None
) -> list[float]:
    t, expect = start, []
    for i, c in enumerate(costs):
        t = t + (c if factors is None else c * factors[i])
        expect.append(t)
        t = t + gap
    return expect


def test_run_ends_and_starts_are_the_stepwise_arithmetic() -> None:
    costs, factors, gap = [0.021, 0.0215, 0.022], [1.01, 0.97, 1.0], 0.0007
    ends = run_ends(gap, 5.0, costs, factors)
    assert list(ends) == _stepwise_ends(gap, 5.0, costs, factors)
    assert pass_starts(5.0, ends, gap) == (5.0, ends[0] + gap, ends[1] + gap)
    assert run_ends(gap, 5.0, costs, None) == run_ends(gap, 5.0, costs, [1.0] * 3)
    assert run_ends(gap, 5.0, [], None) == ()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(1e-6, 5.0), min_size=1, max_size=5000),
    st.floats(0.0, 1e-2), st.floats(0.0, 1e6), st.integers(0, 2**64 - 1),
)  # fmt: skip
def test_the_array_running_sum_is_the_loop_bit_for_bit(costs: list[float], gap: float, start: float,
                                                       seed: int) -> None:  # fmt: skip
    """`np.add.accumulate` adds one element at a time, left to right (no pairwise summation):
    every end is the float the stepwise loop computes, over runs of thousands of passes."""
    factors = factor_table()[factor_picks(seed, len(costs))]
    got = run_ends(gap, start, costs, factors)
    assert list(got) == _stepwise_ends(gap, start, costs, factors.tolist())
    assert list(run_ends(gap, start, costs, None)) == _stepwise_ends(gap, start, costs, None)


def test_truncation_keeps_passes_up_to_the_first_ending_at_or_after_now() -> None:
    ends = (1.0, 2.0, 3.0)
    for now, keep in [(0.5, 1), (1.0, 1), (1.5, 2), (2.0, 2), (2.9, 3), (3.0, 3), (7.0, 3)]:
        want = next((i + 1 for i, e in enumerate(ends) if e >= now), len(ends))
        assert truncation_point(ends, now) == keep == want
    assert truncation_point((), 1.0) == 0
