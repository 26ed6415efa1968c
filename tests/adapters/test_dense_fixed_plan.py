"""`DenseFixedPlan` (dense_fixed_plan.py) gives `dense_fixed`'s and `sampling_time_s`' floats, bit for bit."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.adapters.hardware.batch import Parallel
from deepserve.adapters.hardware.compute import (
    dense_fixed,
    is_dense_plan,
    sampling_time_s,
    span_of,
)
from deepserve.adapters.hardware.dense_fixed_plan import dense_fixed_plan
from deepserve.adapters.hardware.models import PROFILES, ModelProfile
from deepserve.adapters.hardware.specs import NPUS

DENSE = [m for m in PROFILES.values() if m.mla is None and is_dense_plan(m, "main")]
# No dense model of models.py has INT8 weights: their INT8 peak is checked on variants
MODELS = DENSE + [msgspec.structs.replace(m, weight_dtype="int8") for m in DENSE[:2]]


def bits(*xs: float) -> list[str]:
    return [float(x).hex() for x in xs]


def check(m: ModelProfile, npu: str, tp: int, pp: int, tokens: int, logits: int) -> None:
    spec = NPUS[npu]
    par = Parallel(tp=tp, pp=pp)
    plan = dense_fixed_plan(m, spec, par, span_of(spec))
    want = dense_fixed.__wrapped__(m, spec, par, span_of(spec), "main", tokens, logits, False)
    got = plan.fixed(tokens, logits)
    assert bits(*got) == bits(want.linear_s, want.collective_s, want.head_s), (m.name, tp, pp, tokens)
    assert (plan.layers, *bits(plan.fixed_s, plan.launch_floor_s)) == (
        want.layers, *bits(want.fixed_s, want.launch_floor_s))  # fmt: skip
    assert bits(plan.sampling(logits)) == bits(sampling_time_s(m, spec, logits))


def test_every_dense_model_layout_and_npu_on_boundary_shapes() -> None:
    for m in MODELS:
        for npu in NPUS:
            for tp, pp in [(1, 1), (2, 1), (4, 2), (8, 1), (16, 1), (8, 4)]:
                for tokens in (1, 2, 3, 17, 128, 8192, 131_072):
                    for logits in {1, min(tokens, 7), tokens}:
                        check(m, npu, tp, pp, tokens, logits)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(MODELS), st.sampled_from(sorted(NPUS)), st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from([1, 2, 3, 4]), st.integers(1, 1 << 22), st.integers(1, 1 << 22),
)  # fmt: skip
def test_plan_is_dense_fixed_bit_for_bit(
    m: ModelProfile, npu: str, tp: int, pp: int, tokens: int, logits: int
) -> None:
    check(m, npu, tp, pp, tokens, min(logits, tokens))
