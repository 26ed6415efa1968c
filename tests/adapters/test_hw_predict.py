"""The `hw predict` quick-look table."""

import math

import pytest

from deepserve.adapters.hardware.errors import UnknownNameError
from deepserve.adapters.hardware.predict import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_CONTEXT_TOKENS,
    Prediction,
    predict,
    render,
)


@pytest.fixture(scope="module")
def llama70() -> Prediction:
    return predict("llama3-70b", "910b", 8)


def test_grid_covers_every_batch_and_context(llama70):
    grid = {(r.batch_size, r.context_tokens) for r in llama70.latency}
    assert grid == {(b, c) for b in DEFAULT_BATCH_SIZES for c in DEFAULT_CONTEXT_TOKENS}
    for row in llama70.latency:
        assert row.prefill_s > row.decode_step_s > 0
        assert row.decode_tokens_per_s == pytest.approx(row.batch_size / row.decode_step_s)


def test_kv_capacity_is_hbm_minus_reserve_minus_weights(llama70):
    free = llama70.usable_hbm_bytes - llama70.weight_bytes_per_npu
    assert llama70.kv_capacity_tokens == math.floor(free / llama70.kv_bytes_per_token_per_npu)
    assert llama70.kv_bytes_per_token_per_npu == 2 * 80 * 1 * 128 * 2  # one KV head per rank
    for row in llama70.latency:
        assert row.fits_kv == (row.batch_size * row.context_tokens <= llama70.kv_capacity_tokens)


def test_load_paths(llama70):
    seconds = {row.path: row.seconds for row in llama70.loads}
    assert set(seconds) == {"ssd", "dram-hit", "npu-fork-hccs", "npu-fork-roce"}
    assert seconds["ssd"] > seconds["dram-hit"] > seconds["npu-fork-roce"]
    assert seconds["npu-fork-roce"] > seconds["npu-fork-hccs"]


def test_910c_uses_ub_for_npu_fork():
    p = predict("deepseek-r1", "910c", 16, batch_sizes=(1,), context_tokens=(1024,))
    assert {row.path for row in p.loads} == {"ssd", "dram-hit", "npu-fork-ub"}


def test_render_is_a_plain_text_table(llama70):
    text = render(llama70)
    assert text.startswith("llama3-70b on 910b, TP8 (gen1-910b server)\n")
    for word in ("KV capacity", "prefill_ms", "decode_ms", "npu-fork-hccs", "dram-hit"):
        assert word in text
    assert len(text.splitlines()) == 5 + 2 + len(llama70.latency) + 2 + len(llama70.loads)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(model="llama3-70b", npu="a100", tp=8), "npu: unknown npu 'a100'"),
        (dict(model="gpt-5", npu="910b", tp=8), "model: unknown model 'gpt-5'"),
        (dict(model="llama3-70b", npu="910b", tp=3), "tp: 3 does not divide the 64 attention"),
        (dict(model="llama3-70b", npu="910b", tp=0), "tp: must be a positive integer"),
        (dict(model="llama3-70b", npu="910b", tp=16), "tp: 16 exceeds the 8 NPUs"),
        (dict(model="llama3-70b", npu="910b", tp=2), "tp: llama3-70b needs 70.6 GB of weights"),
        (dict(model="llama3-8b", npu="910b", tp=1, batch_sizes=()), "batch_sizes: must list"),
        (dict(model="llama3-8b", npu="910b", tp=1, context_tokens=(0,)), "context_tokens: every"),
        (dict(model="llama3-8b", npu="910b", tp=1, reserve_fraction=1.0), "reserve_fraction: "),
        (dict(model="llama3-8b", npu="910b", tp=1, dp=2, ep=2), "ep: 2 > 1 needs a mixture"),
        (dict(model="deepseek-r1", npu="910c", tp=1, dp=288, ep=16), "ep: must be 1 or dp x tp"),
        (dict(model="deepseek-r1", npu="910c", tp=1, dp=0), "dp: must be a positive"),
        (dict(model="deepseek-r1", npu="910c", tp=8, redundant_experts=8), "ep: shared_expert"),
        (dict(model="deepseek-r1", npu="910c", tp=1, dp=4, ep=4, shared_expert_ranks=4),
         "shared_expert_ranks: 4 leaves no routed-expert rank"),
    ],
)
def test_bad_input_raises_value_error_naming_the_field(kwargs, message):
    with pytest.raises(ValueError) as info:
        predict(**kwargs)
    assert str(info.value).startswith(message)


def test_unknown_names_are_also_key_errors():
    with pytest.raises(UnknownNameError):
        predict("llama3-70b", "h100", 8)


def test_expert_parallel_layout_of_xdeepserve_7_1():
    """DP288/EP288 with 32 shared-expert ranks and 256 redundant experts: each die holds a
    shard of the experts, so it fits where TP1 without EP does not; EPLB's redundant
    replicas and dedicated shared-expert ranks make decode faster than plain EP288."""
    kw = dict(batch_sizes=(60,), context_tokens=(3072,))
    with pytest.raises(ValueError, match="use a larger tp or ep"):
        predict("deepseek-r1", "910c", 1, **kw)
    plain = predict("deepseek-r1", "910c", 1, dp=288, ep=288, **kw)
    tuned = predict("deepseek-r1", "910c", 1, dp=288, ep=288, shared_expert_ranks=32,
                    redundant_experts=256, **kw)
    assert plain.weight_bytes_per_npu < plain.usable_hbm_bytes
    assert tuned.latency[0].decode_step_s < plain.latency[0].decode_step_s
    loads = {row.path: row for row in tuned.loads}
    assert set(loads) == {"ssd", "dram-hit", "npu-fork-ub"}
    assert render(tuned).startswith("deepseek-r1 on 910c, TP1 DP288 EP288 (cm384-910c server)")
