"""Roofline cost of one op group on one NPU: max(FLOPs / effective peak, bytes / effective BW).

The efficiency factors (calibration.py) scale the peaks; nothing here is fitted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from deepserve.adapters.hardware.batch import Seq
from deepserve.adapters.hardware.models import ModelProfile
from deepserve.adapters.hardware.sizes import dtype_bytes, kv_bytes_per_token_layer
from deepserve.adapters.hardware.specs import NpuSpec

ACT_BYTES = 2  # activations are BF16 between ops
# Passes of hidden-sized activations through HBM per layer for the vector ops (2 RMSNorms read
# and write, 2 residual adds, RoPE, dynamic activation quantization). Assumption.
ELEMENTWISE_HIDDEN_PASSES = 10


def op_time_s(flops: float, nbytes: float, npu: NpuSpec, *, int8: bool = False) -> float:
    """An op group is compute-bound or memory-bound, whichever takes longer."""
    peak = npu.tops_int8 if int8 else npu.tflops_fp16
    compute = flops / (peak * npu.eff.compute)
    memory = nbytes / (npu.hbm_bw_bytes_per_s * npu.eff.memory)
    return max(compute, memory)


def linear_time_s(
    params: float, tokens: int, weight_dtype: str, npu: NpuSpec, *, act_elems_per_token: float
) -> float:
    """A (set of) matmul(s) with `params` local weights applied to `tokens` tokens.

    INT8 weights run on the INT8 QMM path (w8a8, xDeepServe §4.7); others on FP16 cubes."""
    int8 = weight_dtype == "int8"
    flops = 2.0 * params * tokens
    nbytes = params * dtype_bytes(weight_dtype) + tokens * act_elems_per_token * ACT_BYTES
    return op_time_s(flops, nbytes, npu, int8=int8)


def attended_pairs(seq: Seq) -> float:
    """(query, key) pairs under a causal mask: each new token sees the context and the new
    tokens before it. Quadratic in a prefill chunk, linear in context for decode."""
    n, c = seq.new_tokens, seq.context_tokens
    return n * c + n * (n + 1) / 2


def _gqa_core(m: ModelProfile, seqs: Iterable[Seq], tp: int) -> tuple[float, float]:
    heads = m.n_heads / tp
    kv_share = math.ceil(m.n_kv_heads / tp) / m.n_kv_heads  # KV heads replicate if fewer than tp
    kv_layer = kv_bytes_per_token_layer(m) * kv_share
    flops = nbytes = 0.0
    for s in seqs:
        flops += 2 * heads * (2 * m.head_dim) * attended_pairs(s)
        nbytes += (s.context_tokens + s.new_tokens) * kv_layer
        nbytes += s.new_tokens * 2 * heads * m.head_dim * ACT_BYTES  # q in, output out
    return flops, nbytes


def _mla_core(m: ModelProfile, seqs: Iterable[Seq], tp: int) -> tuple[float, float]:
    """MLA has two formulations; the engine runs the cheaper one per sequence (assumption):
    absorbed (attend in the 512-d latent: decode) or naive (decompress the cached latent to
    per-head K/V first: prefill). Taking the min keeps the cost monotone in tokens."""
    a = m.mla
    assert a is not None
    heads = m.n_heads / tp
    kv_layer = kv_bytes_per_token_layer(m)  # the latent is not split by TP (xDeepServe Fig. 10)
    flops = nbytes = 0.0
    for s in seqs:
        pairs = attended_pairs(s)
        absorbed = 2 * heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim) * pairs
        naive = 2 * heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim) * pairs
        naive += 2 * a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim) * s.context_tokens
        flops += min(absorbed, naive)
        nbytes += (s.context_tokens + s.new_tokens) * kv_layer
        nbytes += s.new_tokens * 2 * heads * a.kv_lora_rank * ACT_BYTES
    return flops, nbytes


def attention_core_time_s(m: ModelProfile, seqs: Iterable[Seq], tp: int, npu: NpuSpec) -> float:
    """Scores and weighted values of one layer on one TP rank: FLOPs grow with the attended
    pairs (quadratic for prefill), bytes with the KV read (linear in context for decode).
    Runs on FP16 cubes (assumption: INT8 attention is only used for some layers, §4.7)."""
    flops, nbytes = _mla_core(m, seqs, tp) if m.mla else _gqa_core(m, seqs, tp)
    return op_time_s(flops, nbytes, npu)


def elementwise_time_s(
    m: ModelProfile, tokens: int, ffn_local: float, npu: NpuSpec
) -> float:
    """Norms, residuals, RoPE, activation and quantization: pure memory traffic."""
    elems = tokens * (ELEMENTWISE_HIDDEN_PASSES * m.hidden_size + 3 * ffn_local)
    return op_time_s(0.0, elems * ACT_BYTES, npu)
