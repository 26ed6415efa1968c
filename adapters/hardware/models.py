"""Model profiles: the shape of an LLM as the performance model needs it.

Each entry holds the values of the model's public Hugging Face config.json (named in `source`)
plus the published parameter totals. Derived sizes live in sizes.py. Adding a model is adding one
entry to PROFILES.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from deepserve.adapters.hardware.errors import UnknownNameError


class MlaSpec(Struct, frozen=True, kw_only=True):
    """Multi-head latent attention (DeepSeek-V2/V3): KV stored as a compressed latent."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


class MoeSpec(Struct, frozen=True, kw_only=True):
    n_routed_experts: int
    n_shared_experts: int
    top_k: int
    moe_intermediate_size: int
    first_dense_layers: int  # the first layers keep a dense MLP (first_k_dense_replace)


class ModelProfile(Struct, frozen=True, kw_only=True):
    name: str
    source: str  # the public config.json the numbers come from
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    params_total: int  # published, main model (without MTP modules)
    params_active: int  # published, per token
    weight_dtype: str  # dtype of the quantizable weights (attention, MLP, experts)
    kv_dtype: str = "bf16"
    tied_embeddings: bool = False
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    mtp_layers: int = 0  # multi-token-prediction modules shipped with the model


def _llama(name: str, source: str, **shape: Any) -> ModelProfile:
    """A Llama-style dense model: GQA attention, SwiGLU MLP, BF16 weights, untied embeddings."""
    return ModelProfile(name=name, source=source, head_dim=128, weight_dtype="bf16", **shape)


def _mla(kv_lora_rank: int = 512) -> MlaSpec:
    # DeepSeek-V3 config.json; Kimi-K2 reuses the same MLA dimensions.
    return MlaSpec(
        q_lora_rank=1536,
        kv_lora_rank=kv_lora_rank,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
    )


_DEEPSEEK_V3 = ModelProfile(
    name="deepseek-v3",
    source="deepseek-ai/DeepSeek-V3",
    n_layers=61,
    hidden_size=7168,
    n_heads=128,
    n_kv_heads=128,
    head_dim=192,  # qk_nope_head_dim + qk_rope_head_dim
    intermediate_size=18432,  # the 3 dense layers' MLP
    vocab_size=129280,
    params_total=671_000_000_000,  # DeepSeek-V3 report: 671B (+14B MTP module)
    params_active=37_000_000_000,
    # Ascend has no FP8: xDeepServe §4.7 serves the FP8-trained DeepSeek-V3/R1 as INT8 (MLA,
    # MLP, MoE), with the non-RoPE part of the MLA KV cache in INT8 too.
    weight_dtype="int8",
    kv_dtype="int8",
    mla=_mla(),
    moe=MoeSpec(
        n_routed_experts=256,
        n_shared_experts=1,
        top_k=8,
        moe_intermediate_size=2048,
        first_dense_layers=3,
    ),
    mtp_layers=1,  # num_nextn_predict_layers
)

PROFILES: dict[str, ModelProfile] = {
    "llama2-7b": _llama(
        "llama2-7b", "meta-llama/Llama-2-7b-hf", n_layers=32, hidden_size=4096, n_heads=32,
        n_kv_heads=32, intermediate_size=11008, vocab_size=32000,
        params_total=6_738_415_616, params_active=6_738_415_616,
    ),
    "llama3-8b": _llama(
        "llama3-8b", "meta-llama/Meta-Llama-3-8B", n_layers=32, hidden_size=4096, n_heads=32,
        n_kv_heads=8, intermediate_size=14336, vocab_size=128256,
        params_total=8_030_261_248, params_active=8_030_261_248,
    ),
    "llama2-13b": _llama(
        "llama2-13b", "meta-llama/Llama-2-13b-hf", n_layers=40, hidden_size=5120, n_heads=40,
        n_kv_heads=40, intermediate_size=13824, vocab_size=32000,
        params_total=13_015_864_320, params_active=13_015_864_320,
    ),
    "codellama-34b": _llama(
        "codellama-34b", "codellama/CodeLlama-34b-hf", n_layers=48, hidden_size=8192,
        n_heads=64, n_kv_heads=8, intermediate_size=22016, vocab_size=32000,
        params_total=33_743_970_304, params_active=33_743_970_304,
    ),
    "llama3-70b": _llama(
        "llama3-70b", "meta-llama/Meta-Llama-3-70B", n_layers=80, hidden_size=8192, n_heads=64,
        n_kv_heads=8, intermediate_size=28672, vocab_size=128256,
        params_total=70_553_706_496, params_active=70_553_706_496,
    ),
    "qwen2-72b": _llama(  # Qwen2 is Llama-shaped (plus small QKV biases, ignored)
        "qwen2-72b", "Qwen/Qwen2-72B", n_layers=80, hidden_size=8192, n_heads=64,
        n_kv_heads=8, intermediate_size=29568, vocab_size=152064,
        params_total=72_706_203_648, params_active=72_706_203_648,
    ),
    "deepseek-v3": _DEEPSEEK_V3,
    # R1 is V3's architecture with different weights (deepseek-ai/DeepSeek-R1 config.json).
    "deepseek-r1": msgspec.structs.replace(
        _DEEPSEEK_V3, name="deepseek-r1", source="deepseek-ai/DeepSeek-R1"
    ),
    "kimi-k2": ModelProfile(
        name="kimi-k2",
        source="moonshotai/Kimi-K2-Instruct",
        n_layers=61,
        hidden_size=7168,
        n_heads=64,
        n_kv_heads=64,
        head_dim=192,
        intermediate_size=18432,
        vocab_size=163840,
        params_total=1_040_000_000_000,  # Kimi K2 model card: 1T total (1.04T), 32B active
        params_active=32_000_000_000,
        # assumption: served INT8 like DeepSeek (FP8-trained, no FP8 on Ascend; xDeepServe §4.7)
        weight_dtype="int8",
        kv_dtype="int8",
        mla=_mla(),
        moe=MoeSpec(
            n_routed_experts=384,
            n_shared_experts=1,
            top_k=8,
            moe_intermediate_size=2048,
            first_dense_layers=1,  # xDeepServe §4.4: first dispatch at K2's second layer
        ),
        mtp_layers=0,  # K2 ships no MTP module
    ),
}


def model_profile(name: str) -> ModelProfile:
    """Look up a profile by short name (e.g. 'llama3-70b', 'deepseek-r1')."""
    if name not in PROFILES:
        raise UnknownNameError("model", name, PROFILES)
    return PROFILES[name]


def known_models() -> tuple[str, ...]:
    return tuple(sorted(PROFILES))
