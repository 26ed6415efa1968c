"""Forward-pass time: roofline per op group, modes, TP/PP, attention growth with context."""

import msgspec
import pytest

from deepserve.adapters.hardware.batch import (
    Batch,
    Parallel,
    Seq,
    decode_batch,
    logits_tokens,
    prefill_batch,
)
from deepserve.adapters.hardware.compute import forward_time, sampling_time_s
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.roofline import attention_core_time_s
from deepserve.adapters.hardware.sizes import weight_bytes
from deepserve.adapters.hardware.specs import npu_spec

B910 = npu_spec("910b")
C910 = npu_spec("910c")
LLAMA70 = model_profile("llama3-70b")
LLAMA8 = model_profile("llama3-8b")
DEEPSEEK = model_profile("deepseek-r1")
EP288 = Parallel(dp=288, ep=288, shared_expert_ranks=32, redundant_experts=256)


@pytest.mark.parametrize(("model", "npu"), [(LLAMA70, B910), (DEEPSEEK, C910)])
def test_decode_attention_grows_with_context(model, npu):
    contexts = (1, 1024, 8192, 65536)
    times = [attention_core_time_s(model, decode_batch(16, c).seqs, 1, npu) for c in contexts]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert times[-1] > 20 * times[1]


def test_prefill_attention_is_quadratic():
    short = attention_core_time_s(LLAMA8, prefill_batch(1, 8192).seqs, 1, B910)
    long = attention_core_time_s(LLAMA8, prefill_batch(1, 16384).seqs, 1, B910)
    assert long / short == pytest.approx(4.0, rel=0.02)


def test_small_batch_decode_is_bound_by_reading_the_weights():
    cost = forward_time(LLAMA8, B910, decode_batch(1, 128))
    embedding_lookup = LLAMA8.vocab_size * LLAMA8.hidden_size * 2  # gathered, not streamed
    read = weight_bytes(LLAMA8) - embedding_lookup
    weights_s = read / (B910.hbm_bw_bytes_per_s * B910.eff.memory)
    assert cost.linear_s + cost.head_s == pytest.approx(weights_s, rel=0.05)


def test_large_prefill_is_bound_by_compute():
    cost = forward_time(LLAMA8, B910, prefill_batch(4, 4096))
    flops = 2 * LLAMA8.params_total * 4 * 4096
    compute_s = flops / (B910.tflops_fp16 * B910.eff.compute)
    assert cost.linear_s == pytest.approx(compute_s, rel=0.1)


def test_modes_decode_graph_prefill_single_op():
    assert forward_time(LLAMA8, B910, decode_batch(8, 512)).mode == "graph"
    assert forward_time(LLAMA8, B910, decode_batch(8, 512, tokens_per_seq=2)).mode == "graph"
    assert forward_time(LLAMA8, B910, prefill_batch(1, 512)).mode == "single_op"


def test_single_op_launch_overhead_shows_on_tiny_prefills():
    # 5 new tokens: no more work than a 4-token verify step, but launched op by op
    graph = forward_time(LLAMA8, B910, decode_batch(1, 0, tokens_per_seq=4))
    eager = forward_time(LLAMA8, B910, Batch(seqs=(Seq(5, 0),)))
    assert eager.launch_s > graph.launch_s
    assert eager.total_s > graph.total_s


def test_mixed_chunked_prefill_batch_costs_at_least_each_part():
    decode = decode_batch(32, 2048)
    chunk = prefill_batch(1, 512, cached_tokens=0)
    mixed = Batch(seqs=decode.seqs + chunk.seqs)
    t = {name: forward_time(LLAMA70, B910, b, Parallel(tp=8)).total_s
         for name, b in (("decode", decode), ("chunk", chunk), ("mixed", mixed))}  # fmt: skip
    assert t["mixed"] > max(t["decode"], t["chunk"])
    assert t["mixed"] < t["decode"] + t["chunk"]


def test_prefix_cache_hit_makes_prefill_cheaper():
    cold = forward_time(LLAMA8, B910, prefill_batch(1, 8192)).total_s
    warm = forward_time(LLAMA8, B910, prefill_batch(1, 8192, cached_tokens=6144)).total_s
    assert warm < cold / 2


def test_tensor_parallel_splits_work_and_adds_all_reduce():
    batch = prefill_batch(1, 4096)
    tp1 = forward_time(LLAMA8, B910, batch, Parallel(tp=1))
    tp4 = forward_time(LLAMA8, B910, batch, Parallel(tp=4))
    assert tp1.collective_s == 0 and tp4.collective_s > 0
    assert tp4.total_s < tp1.total_s / 2


def test_pipeline_parallel_adds_stage_sends():
    batch = decode_batch(8, 1024)
    pp1 = forward_time(LLAMA70, B910, batch, Parallel(tp=8))
    pp2 = forward_time(LLAMA70, B910, batch, Parallel(tp=4, pp=2))
    assert pp2.collective_s > 0
    assert pp1.total_s > 0 and pp2.total_s > 0


def test_moe_with_ep_pays_dispatch_and_combine():
    batch = decode_batch(60, 3072, tokens_per_seq=2)
    ep = forward_time(DEEPSEEK, C910, batch, EP288)
    assert ep.dispatch_s > 0 and ep.combine_s > 0 and ep.moe_s > 0
    tp = forward_time(DEEPSEEK, C910, decode_batch(4, 3072), Parallel(tp=16))
    assert tp.dispatch_s == tp.combine_s == 0 and tp.moe_s > 0


def test_eplb_shortens_the_combine_barrier():
    batch = decode_batch(60, 3072, tokens_per_seq=2)
    native = msgspec.structs.replace(EP288, redundant_experts=0, shared_expert_ranks=0)
    native = msgspec.structs.replace(native, ep=256, dp=256)
    balanced = msgspec.structs.replace(native, redundant_experts=256)
    slow = forward_time(DEEPSEEK, C910, batch, native).combine_s
    fast = forward_time(DEEPSEEK, C910, batch, balanced).combine_s
    assert slow > 3 * fast


def test_mtp_part_is_one_layer_plus_head():
    batch = decode_batch(60, 3072, tokens_per_seq=2)
    main = forward_time(DEEPSEEK, C910, batch, EP288)
    mtp = forward_time(DEEPSEEK, C910, batch, EP288, part="mtp")
    assert mtp.total_s < main.total_s / 10
    assert mtp.head_s > main.head_s  # MTP adds its projection to the shared head


def test_logits_only_for_decode_positions_and_prefill_tails():
    assert logits_tokens(decode_batch(3, 10, tokens_per_seq=2)) == 6
    assert logits_tokens(prefill_batch(2, 1000)) == 8  # charged up to 4 positions each


def test_sampling_time():
    assert sampling_time_s(DEEPSEEK, C910, 120) > C910.eff.sampling_fixed_s
    with pytest.raises(ValueError, match="^positions: "):
        sampling_time_s(DEEPSEEK, C910, 0)


@pytest.mark.parametrize(
    ("model", "batch", "par", "field"),
    [
        (LLAMA70, decode_batch(1, 1), Parallel(tp=3), "tp"),
        (LLAMA70, decode_batch(1, 1), Parallel(tp=0), "tp"),
        (LLAMA70, decode_batch(1, 1), Parallel(pp=81), "pp"),
        (LLAMA70, decode_batch(1, 1), Parallel(ep=8, dp=8), "ep"),
        (DEEPSEEK, decode_batch(1, 1), Parallel(ep=16, dp=8), "ep"),
        (DEEPSEEK, decode_batch(1, 1), Parallel(ep=8, dp=8, shared_expert_ranks=8),
         "shared_expert_ranks"),
        (LLAMA70, Batch(seqs=()), Parallel(), "batch"),
        (LLAMA70, Batch(seqs=(Seq(0, 5),)), Parallel(), "batch"),
    ],
)  # fmt: skip
def test_bad_layouts_name_the_field(model, batch, par, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        forward_time(model, B910, batch, par)


def test_bad_batch_constructors_and_part():
    with pytest.raises(ValueError, match="^batch: "):
        prefill_batch(1, 10, cached_tokens=10)
    with pytest.raises(ValueError, match="^batch: "):
        decode_batch(0, 10)
    with pytest.raises(ValueError, match="^model: llama3-8b has no MTP module"):
        forward_time(LLAMA8, B910, decode_batch(1, 1), part="mtp")
