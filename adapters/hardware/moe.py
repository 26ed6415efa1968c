"""MoE layer cost under expert parallelism: expert compute, dispatch/combine, barrier waits.

Dispatch and combine are global barriers (xDeepServe §4.1): dispatch waits for the slowest DP
group's attention, combine for the hottest expert rank (§7.1: "dispatch absorbs variance from MLA
compute across all DPs, while combine absorbs imbalance from MoE compute across experts"). Here
the *expected* waits are computed, deterministically; stragglers.py draws per-occurrence samples.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from msgspec import Struct

from deepserve.adapters.hardware.batch import Parallel
from deepserve.adapters.hardware.calibration import DP_COMPUTE_CV, EPLB_HOT_RATIO
from deepserve.adapters.hardware.models import ModelProfile
from deepserve.adapters.hardware.roofline import ACT_BYTES, op_time_s
from deepserve.adapters.hardware.sizes import dtype_bytes, expert_params
from deepserve.adapters.hardware.specs import LinkSpec, NpuSpec
from deepserve.adapters.hardware.transfer import effective_bw_bytes_per_s

# Without EPLB, the hottest expert of a DeepSeek-R1 layer sees 30x the average load
# (xDeepServe Fig. 11a, ShareGPT). Published figure, not fitted.
NATIVE_HOT_EXPERT_RATIO = 30.0
# Per-token quantization scale sent with INT8 dispatch data (one FP32 scale per token, §4.7).
DISPATCH_SCALE_BYTES = 4


class MoeLayerCost(Struct, frozen=True, kw_only=True):
    expert_s: float  # this rank's own expert compute
    dispatch_s: float  # base + expected wait
    combine_s: float  # base + expected wait
    dispatch_base_s: float  # data movement alone: the latency when nobody is late
    combine_base_s: float
    hot_ratio: float  # hottest EP rank's token load / mean load


def expected_max_z(n: int) -> float:
    """E[max of n standard normals] (Blom's approximation); 0 for a single participant."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def hot_rank_ratio(experts_per_rank: float, eplb: bool) -> float:
    """Hottest rank load / mean load. Natively the 30x-hot expert lands on one rank beside
    average experts; EPLB replicates hot experts and leaves the calibrated residual."""
    native = 1.0 + (NATIVE_HOT_EXPERT_RATIO - 1.0) / max(experts_per_rank, 1.0)
    return min(native, EPLB_HOT_RATIO) if eplb else native


def touched_fraction(m: ModelProfile, tokens: float) -> float:
    """Expected fraction of routed experts that receive at least one of `tokens` tokens: a
    small decode batch reads only the experts it routes to."""
    assert m.moe is not None
    miss = 1.0 - m.moe.top_k / m.moe.n_routed_experts
    return 1.0 - miss**tokens


def _expert_time_s(
    m: ModelProfile, npu: NpuSpec, assignments: float, resident: float, touched: float
) -> float:
    """`assignments` token-expert pairs over `resident` expert weights, `touched` of them read."""
    params = expert_params(m)
    flops = 2.0 * params * assignments
    nbytes = touched * resident * params * dtype_bytes(m.weight_dtype)
    nbytes += assignments * 2 * m.hidden_size * ACT_BYTES
    return op_time_s(flops, nbytes, npu, int8=m.weight_dtype == "int8")


def a2a_base_s(bytes_per_rank: float, ranks: int, link: LinkSpec) -> float:
    """XCCL all-to-all (xDeepServe §3.2): two phases (token counts to every rank, then data),
    a control cost per peer (metadata field write and poll), bytes at link bandwidth."""
    peers = ranks - 1
    bw = effective_bw_bytes_per_s(link)
    return 2 * link.latency_s + peers * link.per_message_s + bytes_per_rank / bw


def _tp_sliced_moe(m: ModelProfile, npu: NpuSpec, par: Parallel, tokens: int) -> MoeLayerCost:
    """ep == 1: every TP rank holds 1/tp of every expert and runs all tokens through it."""
    assert m.moe is not None
    routed = tokens * m.moe.top_k / par.tp
    shared = tokens * m.moe.n_shared_experts / par.tp
    touched = touched_fraction(m, tokens)
    resident = m.moe.n_routed_experts / par.tp
    own = _expert_time_s(m, npu, routed, resident, touched)
    own += _expert_time_s(m, npu, shared, m.moe.n_shared_experts / par.tp, 1.0)
    return MoeLayerCost(
        expert_s=own, dispatch_s=0.0, combine_s=0.0, dispatch_base_s=0.0,
        combine_base_s=0.0, hot_ratio=1.0,
    )  # fmt: skip


def _a2a_bases(
    m: ModelProfile, npu: NpuSpec, par: Parallel, own_tokens: float, dests: int, link: LinkSpec
) -> tuple[float, float]:
    """Dispatch and combine with nobody late. Dispatch of an INT8 model sends INT8 tokens plus a
    scale, quantized in the kernel (§3.2, §4.7); combine returns BF16 expert outputs."""
    remote = (par.ep - 1) / par.ep  # the share of picks that leaves the rank
    quant = m.weight_dtype == "int8"
    token_bytes = m.hidden_size + DISPATCH_SCALE_BYTES if quant else m.hidden_size * ACT_BYTES
    dispatch = a2a_base_s(own_tokens * dests * token_bytes * remote, par.ep, link)
    if quant:  # read BF16, write INT8
        dispatch += op_time_s(0.0, own_tokens * m.hidden_size * (ACT_BYTES + 1), npu)
    combine = a2a_base_s(own_tokens * dests * m.hidden_size * ACT_BYTES * remote, par.ep, link)
    return dispatch, combine


def moe_layer_cost(
    m: ModelProfile,
    npu: NpuSpec,
    par: Parallel,
    tokens_per_dp: int,
    pre_dispatch_s: float,
    link: LinkSpec,
) -> MoeLayerCost:
    """One MoE layer as seen by a typical EP rank; the waits make the slowest rank set the pace."""
    if m.moe is None:
        raise ValueError(f"model: {m.name} has no MoE layers")
    if par.ep == 1:
        return _tp_sliced_moe(m, npu, par, tokens_per_dp)
    moe = m.moe
    global_tokens = tokens_per_dp * par.dp
    own_tokens = tokens_per_dp / par.tp  # a DP group's tokens are split over its TP ranks
    routed_ranks = par.ep - par.shared_expert_ranks
    per_rank = (moe.n_routed_experts + par.redundant_experts) / routed_ranks
    assignments = global_tokens * moe.top_k / routed_ranks
    touched = touched_fraction(m, global_tokens)
    # A rank cannot receive more than every token's picks among the experts it hosts.
    cap = global_tokens * min(per_rank, moe.top_k) / assignments
    hot = max(1.0, min(hot_rank_ratio(per_rank, par.redundant_experts > 0), cap))
    own = _expert_time_s(m, npu, assignments, math.ceil(per_rank), touched)
    pace = _expert_time_s(m, npu, assignments * hot, math.ceil(per_rank), touched)
    dests = moe.top_k
    if par.shared_expert_ranks:
        dests += moe.n_shared_experts
        shared_tokens = global_tokens * moe.n_shared_experts / par.shared_expert_ranks
        pace = max(pace, _expert_time_s(m, npu, shared_tokens, math.ceil(per_rank), 1.0))
    else:  # every rank runs the shared experts for its own tokens, in full
        local = _expert_time_s(m, npu, own_tokens * moe.n_shared_experts, moe.n_shared_experts, 1.0)
        own, pace = own + local, pace + local
    dispatch_base, combine_base = _a2a_bases(m, npu, par, own_tokens, dests, link)
    dispatch_wait = expected_max_z(par.dp) * DP_COMPUTE_CV * pre_dispatch_s
    combine_wait = (pace - own) + expected_max_z(par.ep) * DP_COMPUTE_CV * own
    return MoeLayerCost(
        expert_s=own,
        dispatch_s=dispatch_base + dispatch_wait,
        combine_s=combine_base + combine_wait,
        dispatch_base_s=dispatch_base,
        combine_base_s=combine_base,
        hot_ratio=hot,
    )
