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
        if row.fits_kv:
            assert row.decode_tokens_per_s == pytest.approx(row.batch_size / row.decode_step_s)
        else:  # a throughput the cell cannot reach is not reported
            assert row.decode_tokens_per_s is None


def test_kv_capacity_is_hbm_minus_reserve_minus_weights(llama70):
    free = llama70.usable_hbm_bytes - llama70.weight_bytes_per_npu
    assert llama70.kv_capacity_tokens == math.floor(free / llama70.kv_bytes_per_token_per_npu)
    assert llama70.kv_bytes_per_token_per_npu == 2 * 80 * 1 * 128 * 2  # one KV head per rank
    for row in llama70.latency:  # KV of batch x context plus the prefill's activations
        need = row.batch_size * row.context_tokens * llama70.kv_bytes_per_token_per_npu
        assert row.fits_kv == (need + row.activation_bytes <= free)
        if row.batch_size * row.context_tokens > llama70.kv_capacity_tokens:
            assert not row.fits_kv


def test_load_paths(llama70):
    seconds = {row.path: row.seconds for row in llama70.loads}
    assert set(seconds) == {"ssd", "dram-hit", "npu-fork-hccs", "npu-fork-roce"}
    assert seconds["ssd"] > seconds["dram-hit"] > seconds["npu-fork-roce"]
    # A TP8 source and a TP8 target need 16 NPUs: HCCS does not leave the 8-NPU server.
    assert seconds["npu-fork-hccs"] is None
    small = {r.path: r.seconds for r in predict("llama3-8b", "910b", 2, batch_sizes=(1,)).loads}
    assert small["npu-fork-roce"] > small["npu-fork-hccs"]


def test_910c_uses_ub_for_npu_fork():
    p = predict("deepseek-r1", "910c", 16, batch_sizes=(1,), context_tokens=(1024,))
    rows = {row.path: row for row in p.loads}
    # CloudMatrix384's RoCE plane leads to other SuperPods, not between its own dies: no row
    assert list(rows) == ["ssd", "dram-hit", "npu-fork-ub"]
    assert rows["npu-fork-ub"].seconds is not None
    assert "npu-fork-roce" not in render(p)


def test_render_is_a_plain_text_table(llama70):
    text = render(llama70)
    assert text.startswith("llama3-70b on 910b, TP8 (gen1-910b server, 8-server gen1 cluster)\n")
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
    replicas and dedicated shared-expert ranks make decode faster than plain EP256 (plain
    EP288 would leave 32 ranks without an expert, and is refused)."""
    kw = dict(batch_sizes=(60,), context_tokens=(3072,))
    with pytest.raises(ValueError, match="use a larger tp or ep"):
        predict("deepseek-r1", "910c", 1, **kw)
    with pytest.raises(ValueError, match="^ep: 288 routed-expert ranks"):  # 32 ranks idle
        predict("deepseek-r1", "910c", 1, dp=288, ep=288, **kw)
    plain = predict("deepseek-r1", "910c", 1, dp=256, ep=256, **kw)
    tuned = predict("deepseek-r1", "910c", 1, dp=288, ep=288, shared_expert_ranks=32,
                    redundant_experts=256, **kw)
    assert plain.weight_bytes_per_npu < plain.usable_hbm_bytes
    assert tuned.latency[0].decode_step_s < plain.latency[0].decode_step_s
    loads = {row.path: row for row in tuned.loads}
    assert set(loads) == {"ssd", "dram-hit", "npu-fork-ub"}
    assert render(tuned).startswith("deepseek-r1 on 910c, TP1 DP288 EP288 (cm384-910c server")


def test_cells_that_do_not_fit_report_no_throughput(llama70):
    row = next(r for r in llama70.latency if (r.batch_size, r.context_tokens) == (64, 16384))
    assert not row.fits_kv and row.decode_tokens_per_s is None
    line = next(x for x in render(llama70).splitlines() if x.split()[:2] == ["64", "16384"])
    assert "no-fit" in line and line.endswith(" no")


def test_activation_memory_counts_in_the_fit_check():
    """32 x 16K tokens of KV fit the KV capacity, but one prefill forward of 524K tokens also
    needs ~25 GB of activations on each NPU: the cell does not fit."""
    p = predict("llama3-70b", "910b", 8, batch_sizes=(1, 32), context_tokens=(16384,))
    small, big = p.latency
    assert big.batch_size * big.context_tokens <= p.kv_capacity_tokens
    assert big.activation_bytes > 20e9 and not big.fits_kv
    assert small.activation_bytes < 1e9 and small.fits_kv


def test_mtp_column_is_the_mtp_iteration():
    from deepserve.adapters.hardware.batch import Parallel
    from deepserve.adapters.hardware.models import model_profile
    from deepserve.adapters.hardware.mtp import mtp_decode_iteration
    from deepserve.adapters.hardware.specs import npu_spec

    p = predict("deepseek-r1", "910c", 16, mtp_acceptance=0.8, batch_sizes=(8,),
                context_tokens=(2048,))  # fmt: skip
    it = mtp_decode_iteration(model_profile("deepseek-r1"), npu_spec("910c"), batch_size=8,
                              context_tokens=2048, par=Parallel(tp=16), acceptance=0.8)  # fmt: skip
    row = p.latency[0]
    assert row.mtp_tpot_s == pytest.approx(it.tpot_s)
    assert row.mtp_tokens_per_s == pytest.approx(8 / it.tpot_s)
    assert row.mtp_tpot_s < row.decode_step_s  # 1.8 tokens per iteration beat one per step
    assert "mtp_tpot_ms" in render(p) and "MTP acceptance 0.8" in render(p)
    with pytest.raises(ValueError, match="^mtp: kimi-k2 ships no MTP module"):
        predict("kimi-k2", "910c", 16, dp=4, ep=64, mtp_acceptance=0.8, **_ONE)
    with pytest.raises(ValueError, match=r"^mtp: acceptance must be in \[0, 1\]"):
        predict("deepseek-r1", "910c", 16, mtp_acceptance=1.2, **_ONE)


_ONE = dict(batch_sizes=(1,), context_tokens=(1024,))


def test_ttft_of_a_pd_pair_is_prefill_plus_kv_transfer_plus_first_decode():
    from deepserve.adapters.hardware.specs import link_spec
    from deepserve.adapters.hardware.transfer import transfer_time_s

    p = predict("llama3-8b", "910b", 2, pd_link="roce", batch_sizes=(4,), context_tokens=(4096,))
    row = p.latency[0]
    kv = 4 * 4096 * p.kv_bytes_per_token_per_npu
    assert row.kv_transfer_s == pytest.approx(transfer_time_s(kv, link_spec("roce")))
    assert row.ttft_s == pytest.approx(row.prefill_s + row.kv_transfer_s + row.decode_step_s)
    hccs = predict("llama3-8b", "910b", 2, pd_link="hccs", batch_sizes=(4,), context_tokens=(4096,))
    assert hccs.latency[0].kv_transfer_s < row.kv_transfer_s  # both TEs in one server
    assert "ttft_ms" in render(p)
    ub = predict("llama3-8b", "910c", 2, pd_link="ub", batch_sizes=(4,), context_tokens=(4096,))
    assert ub.latency[0].kv_transfer_s < row.kv_transfer_s


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(npu="910b", tp=8, pd_link="hccs"), "pd_link: 16 NPUs over hccs exceed one hccs domain"),
        (dict(npu="910b", tp=2, pd_link="ub"), "pd_link: a gen1 cluster has no ub link"),
        (dict(npu="910c", tp=2, pd_link="hccs"), "pd_link: a cm384 cluster has no hccs link"),
        (dict(npu="910c", tp=2, pd_link="roce"), "pd_link: a cm384 cluster has no roce link"),
        (dict(npu="910b", tp=2, pd_link="nvlink"), "pd_link: must be one of roce, hccs, ub"),
        (dict(npu="910b", tp=2, fork_targets=0), "fork_targets: must be a positive integer"),
    ],
)
def test_pd_link_and_fork_targets_are_checked(kwargs, message):
    with pytest.raises(ValueError) as info:
        predict("llama3-8b", **kwargs, **_ONE)
    assert str(info.value).startswith(message)
