"""Sizes derived from a model profile: parameter counts, weight bytes, KV bytes per token.

Derived rather than stored, so tests can check the derivations against the published totals.
"""

from __future__ import annotations

from deepserve.adapters.hardware.errors import UnknownNameError
from deepserve.adapters.hardware.models import ModelProfile

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise UnknownNameError("dtype", dtype, DTYPE_BYTES)
    return DTYPE_BYTES[dtype]


def attention_params(m: ModelProfile) -> int:
    """Weights of one attention block (projections; norms are negligible)."""
    h = m.hidden_size
    if m.mla is None:
        qkv = h * (m.n_heads + 2 * m.n_kv_heads) * m.head_dim
        return qkv + m.n_heads * m.head_dim * h
    a = m.mla
    q = h * a.q_lora_rank + a.q_lora_rank * m.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim)
    kv = h * (a.kv_lora_rank + a.qk_rope_head_dim)
    kv += a.kv_lora_rank * m.n_heads * (a.qk_nope_head_dim + a.v_head_dim)
    return q + kv + m.n_heads * a.v_head_dim * h


def dense_mlp_params(m: ModelProfile) -> int:
    """A gated (SwiGLU) MLP: gate, up and down projections."""
    return 3 * m.hidden_size * m.intermediate_size


def expert_params(m: ModelProfile) -> int:
    if m.moe is None:
        return 0
    return 3 * m.hidden_size * m.moe.moe_intermediate_size


def gate_params(m: ModelProfile) -> int:
    return 0 if m.moe is None else m.hidden_size * m.moe.n_routed_experts


def dense_layers(m: ModelProfile) -> int:
    return m.n_layers if m.moe is None else m.moe.first_dense_layers


def moe_layers(m: ModelProfile) -> int:
    return m.n_layers - dense_layers(m)


def embedding_params(m: ModelProfile) -> int:
    """Input embedding plus LM head (one matrix when tied)."""
    return m.vocab_size * m.hidden_size * (1 if m.tied_embeddings else 2)


def moe_layer_params(m: ModelProfile, active: bool = False) -> int:
    if m.moe is None:
        return 0
    experts = m.moe.top_k if active else m.moe.n_routed_experts
    return (experts + m.moe.n_shared_experts) * expert_params(m) + gate_params(m)


def mtp_params(m: ModelProfile) -> int:
    """One MTP module: a full decoder layer plus the projection joining hidden and embedding."""
    if m.mtp_layers == 0:
        return 0
    layer = attention_params(m) + (moe_layer_params(m) if m.moe else dense_mlp_params(m))
    return m.mtp_layers * (layer + 2 * m.hidden_size * m.hidden_size)


def quantizable_params(m: ModelProfile) -> int:
    """Main-model weights stored in weight_dtype (xDeepServe §4.7: MLA, MLP, MoE)."""
    layers = m.n_layers * attention_params(m) + dense_layers(m) * dense_mlp_params(m)
    return layers + moe_layers(m) * moe_layer_params(m)


def total_params(m: ModelProfile) -> int:
    """Derived main-model parameter count (cross-checked against the published one in tests)."""
    return quantizable_params(m) + embedding_params(m)


def active_params(m: ModelProfile) -> int:
    """Parameters per token, counted like the published figures (embedding included)."""
    layers = m.n_layers * attention_params(m) + dense_layers(m) * dense_mlp_params(m)
    return layers + moe_layers(m) * moe_layer_params(m, active=True) + embedding_params(m)


def head_params(m: ModelProfile) -> int:
    return m.vocab_size * m.hidden_size


def weight_bytes(m: ModelProfile, include_mtp: bool = True) -> int:
    """Bytes to load: quantizable weights in weight_dtype; embeddings and head stay BF16
    (xDeepServe §4.7 quantizes MLA, MLP and MoE only)."""
    quant = quantizable_params(m) + (mtp_params(m) if include_mtp else 0)
    return quant * dtype_bytes(m.weight_dtype) + embedding_params(m) * DTYPE_BYTES["bf16"]


def kv_bytes_per_token_layer(m: ModelProfile) -> int:
    """KV-cache bytes one token occupies in one layer, whole model (no TP split).

    MLA stores the latent (kv_lora_rank) plus the shared RoPE key (qk_rope_head_dim) once per
    layer; with an INT8 KV cache only the non-RoPE latent is INT8, RoPE stays BF16 (§4.7)."""
    kvb = dtype_bytes(m.kv_dtype)
    if m.mla is None:
        return 2 * m.n_kv_heads * m.head_dim * kvb
    rope_bytes = max(kvb, DTYPE_BYTES["bf16"])
    return m.mla.kv_lora_rank * kvb + m.mla.qk_rope_head_dim * rope_bytes


def kv_bytes_per_token(m: ModelProfile) -> int:
    """KV bytes per token over the main model's layers."""
    return m.n_layers * kv_bytes_per_token_layer(m)
