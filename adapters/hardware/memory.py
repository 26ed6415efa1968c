"""HBM budget of one NPU: resident weights for a layout, KV bytes per token, KV capacity."""

from __future__ import annotations

import math

from deepserve.adapters.hardware.batch import Batch, Parallel, logits_tokens
from deepserve.adapters.hardware.models import ModelProfile
from deepserve.adapters.hardware.sizes import (
    attention_params,
    dense_layers,
    dense_mlp_params,
    dtype_bytes,
    embedding_params,
    expert_params,
    gate_params,
    kv_bytes_per_token_layer,
    moe_layer_params,
    moe_layers,
)
from deepserve.adapters.hardware.specs import NpuSpec

# HBM kept free of weights and KV for activations, workspaces, communication buffers (XCCL's
# managed areas, xDeepServe §3.1) and the runtime. Assumption, like vLLM's default
# gpu_memory_utilization of 0.9; DeepServe §6 profiles the real figure offline.
RESERVE_FRACTION = 0.10


def _moe_layer_params_per_npu(m: ModelProfile, par: Parallel) -> float:
    if m.moe is None:
        return 0.0
    if par.ep == 1:
        return moe_layer_params(m) / par.tp
    routed_ranks = par.ep - par.shared_expert_ranks
    slots = math.ceil((m.moe.n_routed_experts + par.redundant_experts) / routed_ranks)
    shared = 0 if par.shared_expert_ranks else m.moe.n_shared_experts
    return (slots + shared) * expert_params(m) + gate_params(m)


def weights_per_npu_bytes(m: ModelProfile, par: Parallel) -> float:
    """Weights resident on the busiest NPU of the layout (MTP module included when shipped)."""
    stage = math.ceil(m.n_layers / par.pp) / m.n_layers  # the largest PP stage's share
    attn = attention_params(m) / par.tp
    moe = _moe_layer_params_per_npu(m, par)
    layers = m.n_layers * attn + dense_layers(m) * dense_mlp_params(m) / par.tp
    layers += moe_layers(m) * moe
    mtp = m.mtp_layers * (attn + (moe if m.moe else dense_mlp_params(m) / par.tp))
    mtp += m.mtp_layers * 2 * m.hidden_size * m.hidden_size / par.tp
    # With PP, the embedding sits on the first stage and the (untied) head on the last.
    embed = embedding_params(m) / par.tp / (2 if par.pp > 1 and not m.tied_embeddings else 1)
    quant = layers * stage + mtp
    return quant * dtype_bytes(m.weight_dtype) + embed * dtype_bytes("bf16")


def kv_bytes_per_token_per_npu(m: ModelProfile, par: Parallel) -> float:
    """KV bytes one token occupies on one NPU: GQA splits KV heads over TP (replicating them
    when there are fewer heads than ranks); MLA's latent is replicated on every TP rank."""
    layers = math.ceil(m.n_layers / par.pp)
    per_layer: float = kv_bytes_per_token_layer(m)
    if m.mla is None:
        per_layer *= math.ceil(m.n_kv_heads / par.tp) / m.n_kv_heads
    return layers * per_layer


def usable_hbm_bytes(npu: NpuSpec, reserve_fraction: float = RESERVE_FRACTION) -> float:
    if not 0.0 <= reserve_fraction < 1.0:
        raise ValueError(f"reserve_fraction: must be in [0, 1), got {reserve_fraction}")
    return npu.hbm_bytes * (1.0 - reserve_fraction)


def activation_bytes(m: ModelProfile, batch: Batch, par: Parallel) -> float:
    """Peak activations on one NPU while it runs `batch`: one layer's temporaries are live at a
    time (layers run in turn), on top of the residual stream, plus the FP32 logits.

    Per token: the residual stream and its normed copy (2h); then the wider of the attention
    temporaries (q, k, v and output for the local heads; MLA decompressed to per-head K/V, the
    naive prefill form) and the MLP temporaries (gate and up, 2 I/tp; for MoE, every token-expert
    pair a rank receives: the dispatched hidden state plus gate and up of one expert). BF16.
    Assumption (no kernel-level measurement in the seed papers): flash-style attention keeps no
    score matrix; workspaces and communication buffers stay in RESERVE_FRACTION."""
    tokens = batch.tokens
    heads = m.n_heads / par.tp
    if m.mla is not None:
        a = m.mla
        attn = heads * (2 * (a.qk_nope_head_dim + a.qk_rope_head_dim) + 2 * a.v_head_dim)
    else:
        kv_heads = math.ceil(m.n_kv_heads / par.tp)
        attn = (2 * heads + 2 * kv_heads) * m.head_dim
    mlp = 2.0 * m.intermediate_size / par.tp if dense_layers(m) else 0.0
    if m.moe is not None:
        picks = m.moe.top_k + m.moe.n_shared_experts
        width = m.hidden_size + 2 * m.moe.moe_intermediate_size
        if par.ep > 1:  # tokens of all DP groups arrive, spread over the EP ranks
            per_token = picks * par.dp * par.tp / max(1, par.ep - par.shared_expert_ranks)
            mlp = max(mlp, per_token * width / par.tp)
        else:  # every TP rank runs every pick through its slice of the experts
            mlp = max(mlp, picks * (m.hidden_size + 2 * m.moe.moe_intermediate_size / par.tp))
    per_token = 2 * m.hidden_size + max(attn, mlp)
    logits = logits_tokens(batch) * m.vocab_size / par.tp * 4
    return tokens * per_token * 2 + logits


def kv_capacity_tokens(
    m: ModelProfile, npu: NpuSpec, par: Parallel, reserve_fraction: float = RESERVE_FRACTION
) -> int:
    """Tokens of KV cache one TP group holds: HBM minus reserve minus weights, per NPU."""
    free = usable_hbm_bytes(npu, reserve_fraction) - weights_per_npu_bytes(m, par)
    return max(0, math.floor(free / kv_bytes_per_token_per_npu(m, par)))
