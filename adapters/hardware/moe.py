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
from deepserve.adapters.hardware.layout import Span, peers_split
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


def hot_rank_ratio(
    experts_per_rank: float, eplb: bool, assignments_per_rank: float = math.inf, ranks: int = 1
) -> float:
    """Hottest rank load / mean load in one step: a persistent part plus a sampling part.

    Persistent: expert popularity measured over many tokens (xDeepServe Fig. 11a, the 30x-hot
    expert lands on one rank beside average experts), or with EPLB the calibrated residual
    (routing drifts from the minute-old statistics the placement used, §4.5). It does not even
    out with more tokens: EPLB exists because it persists. Sampling: in one step a rank receives
    a Poisson-like count with mean `assignments_per_rank` (tokens routed independently,
    assumption), so the most loaded of `ranks` ranks exceeds the mean by about z(ranks) standard
    deviations: + z(ranks) / sqrt(mean). A decode step of a few tokens is lumpy; a prefill step
    routing thousands of tokens per rank is not."""
    native = 1.0 + (NATIVE_HOT_EXPERT_RATIO - 1.0) / max(experts_per_rank, 1.0)
    persistent = min(native, EPLB_HOT_RATIO) if eplb else native
    if assignments_per_rank <= 0:
        raise ValueError(f"assignments_per_rank: must be > 0, got {assignments_per_rank}")
    return persistent + expected_max_z(ranks) / math.sqrt(assignments_per_rank)


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


def a2a_base_s(bytes_per_rank: float, ranks: int, link: LinkSpec | Span) -> float:
    """XCCL/HCCL all-to-all (xDeepServe §3.2): two phases (token counts to every rank, then
    data), a control cost per peer (metadata field write and poll), and `bytes_per_rank` (what
    one rank sends to the others, split evenly over them) on the links the peers sit behind.

    Peers in the rank's server are reached over the intra link (a full mesh drives up to
    `ports` links at once), peers in other servers over the inter link. When both are the same
    kind (UB: one port per die) the bytes share it; otherwise (HCCS mesh and RoCE NIC) the two
    parts run in parallel and the slower one sets the time."""
    span = link if isinstance(link, Span) else Span.single(link)
    local, remote = peers_split(ranks, span)
    if local + remote == 0:
        return 0.0
    per_peer_bytes = bytes_per_rank / (local + remote)
    intra, inter = span.intra, span.inter
    fixed = local * intra.per_message_s + remote * inter.per_message_s
    latency = 2 * max(intra.latency_s if local else 0.0, inter.latency_s if remote else 0.0)
    if intra.kind == inter.kind:
        lanes = min(intra.ports, local + remote)
        stream = bytes_per_rank / (effective_bw_bytes_per_s(intra) * lanes)
    else:
        intra_bw = effective_bw_bytes_per_s(intra) * min(intra.ports, max(local, 1))
        t_intra = local * per_peer_bytes / intra_bw
        t_inter = remote * per_peer_bytes / effective_bw_bytes_per_s(inter)
        stream = max(t_intra, t_inter)
    return latency + fixed + stream


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
    m: ModelProfile, npu: NpuSpec, par: Parallel, own_tokens: float, dests: int, link: Span
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
    link: LinkSpec | Span,
) -> MoeLayerCost:
    """One MoE layer as seen by a typical EP rank; the waits make the slowest rank set the pace.

    `link` is one link for every peer, or the Span of the layout (intra-server and
    inter-server links): EP ranks are placed server-major, so an EP group wider than a server
    reaches its remote peers over the inter-server link."""
    if m.moe is None:
        raise ValueError(f"model: {m.name} has no MoE layers")
    if par.ep == 1:
        return _tp_sliced_moe(m, npu, par, tokens_per_dp)
    span = link if isinstance(link, Span) else Span.single(link)
    moe = m.moe
    global_tokens = tokens_per_dp * par.dp
    own_tokens = tokens_per_dp / par.tp  # a DP group's tokens are split over its TP ranks
    routed_ranks = par.ep - par.shared_expert_ranks
    per_rank = (moe.n_routed_experts + par.redundant_experts) / routed_ranks
    assignments = global_tokens * moe.top_k / routed_ranks
    touched = touched_fraction(m, global_tokens)
    # A rank cannot receive more than every token's picks among the experts it hosts.
    cap = global_tokens * min(per_rank, moe.top_k) / assignments
    eplb = par.redundant_experts > 0
    hot = max(1.0, min(hot_rank_ratio(per_rank, eplb, assignments, routed_ranks), cap))
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
    dispatch_base, combine_base = _a2a_bases(m, npu, par, own_tokens, dests, span)
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
