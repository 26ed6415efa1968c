"""Forward-pass time of a batch on a parallel group: the sum of per-layer roofline op groups,
MoE dispatch/combine, TP/PP communication and launch overhead.

Ops in a layer run one after another (decode graphs serialize them; xDeepServe Fig. 10), so a
layer costs the sum of its op groups, each the roofline max of its compute and memory time.
"""

from __future__ import annotations

import functools
from typing import Literal

from msgspec import Struct

from deepserve.adapters.hardware.batch import (
    Batch,
    Parallel,
    is_graph_batch,
    logits_tokens,
    validate,
)
from deepserve.adapters.hardware.layout import (
    Span,
    check_layout,
    group_link,
    largest_cluster,
    span_for,
)
from deepserve.adapters.hardware.models import ModelProfile
from deepserve.adapters.hardware.moe import moe_layer_cost
from deepserve.adapters.hardware.roofline import (
    ACT_BYTES,
    attention_core_time_s,
    elementwise_time_s,
    linear_time_s,
    op_time_s,
)
from deepserve.adapters.hardware.sizes import (
    attention_params,
    dense_layers,
    dense_mlp_params,
    gate_params,
    head_params,
    moe_layers,
)
from deepserve.adapters.hardware.specs import LinkSpec, NpuSpec
from deepserve.adapters.hardware.transfer import allreduce_time_s, transfer_time_s

# Kernels per decoder layer, counting fused kernels (norm, QKV/MLA prolog, RoPE, attention,
# output projection, residual, norm, MLP or gate + top-k + dispatch + experts + combine).
# Assumption, from the shape of Ascend decoder graphs; they only set the launch overhead.
OPS_DENSE_LAYER = 14
OPS_MOE_LAYER = 24
OPS_MLA_EXTRA = 6  # the MLA prolog is split into several kernels (xDeepServe Fig. 10)
OPS_HEAD = 3
SAMPLING_OPS = 4
SAMPLING_PASSES = 3  # FP32 logits read by softmax/top-k/argmax kernels. Assumption.


class ForwardCost(Struct, frozen=True, kw_only=True):
    mode: Literal["graph", "single_op"]
    attention_s: float  # attention kernels (scores and values), all layers
    linear_s: float  # projections, dense MLPs, gate, elementwise ops
    moe_s: float  # this rank's expert compute
    dispatch_s: float
    combine_s: float
    collective_s: float  # TP all-reduce and PP stage-to-stage sends
    head_s: float  # final norm + LM head
    launch_s: float  # host and kernel launch overhead not hidden behind execution
    total_s: float


class _Layer(Struct, frozen=True):
    attention_s: float
    linear_s: float
    moe_s: float
    dispatch_s: float
    combine_s: float
    collective_s: float


def _layer(
    m: ModelProfile, npu: NpuSpec, batch: Batch, par: Parallel, span: Span, moe: bool
) -> _Layer:
    tokens = batch.tokens
    attn = attention_core_time_s(m, batch.seqs, par.tp, npu)
    proj = linear_time_s(
        attention_params(m) / par.tp, tokens, m.weight_dtype, npu,
        act_elems_per_token=4 * m.hidden_size,
    )  # fmt: skip
    ffn_local = 0.0 if moe else m.intermediate_size / par.tp
    linear = proj + elementwise_time_s(m, tokens, ffn_local, npu)
    # A TP group within one server all-reduces over the intra link, a wider one over the
    # inter-server link, its bottleneck.
    tp_link = group_link(par.tp, span)
    allreduce = allreduce_time_s(tokens * m.hidden_size * ACT_BYTES, par.tp, tp_link)
    collective = 2 * allreduce
    if not moe:
        linear += linear_time_s(
            dense_mlp_params(m) / par.tp, tokens, m.weight_dtype, npu,
            act_elems_per_token=m.hidden_size + 3 * ffn_local,
        )  # fmt: skip
        return _Layer(attn, linear, 0.0, 0.0, 0.0, collective)
    linear += linear_time_s(gate_params(m), tokens, "bf16", npu, act_elems_per_token=m.hidden_size)
    cost = moe_layer_cost(m, npu, par, tokens, attn + linear + allreduce, span)
    return _Layer(attn, linear, cost.expert_s, cost.dispatch_s, cost.combine_s, collective)


def _head_linear_s(m: ModelProfile, npu: NpuSpec, logits: int, par: Parallel) -> float:
    """LM head (BF16, vocab-parallel over TP) on the `logits` positions that need logits."""
    return linear_time_s(
        head_params(m) / par.tp, logits, "bf16", npu,
        act_elems_per_token=m.hidden_size + m.vocab_size / par.tp,
    )  # fmt: skip


def _mtp_projection_s(m: ModelProfile, npu: NpuSpec, tokens: int) -> float:
    return linear_time_s(
        2 * m.hidden_size * m.hidden_size * m.mtp_layers, tokens, "bf16", npu,
        act_elems_per_token=3 * m.hidden_size,
    )  # fmt: skip


def _layer_plan(m: ModelProfile, part: str) -> tuple[tuple[bool, int], ...]:
    """(is_moe, count) per layer kind for the main model or its MTP module."""
    if part == "main":
        return ((False, dense_layers(m)), (True, moe_layers(m)))
    if part == "mtp":
        if m.mtp_layers == 0:
            raise ValueError(f"model: {m.name} has no MTP module")
        return ((m.moe is not None, m.mtp_layers),)
    raise ValueError(f"part: must be 'main' or 'mtp', got {part!r}")


class DenseFixed(Struct, frozen=True):
    """Everything of a dense model's forward pass but the attention core: what a batch of
    `tokens` new tokens costs whatever its contexts (weights, projections, MLPs, elementwise ops,
    collectives, head, launch). A pass costs `total_s(attention core time of one layer)`.

    Decode runs the same batch shape thousands of times with only the contexts growing, so this
    part is computed once per shape (`dense_fixed`, cached by exact value) and a pass costs a
    few float operations — in the same order as the full computation, so the result is the
    same float."""

    mode: Literal["graph", "single_op"]
    layers: int  # decoder layers of the (dense) plan
    linear_s: float  # all layers
    collective_s: float  # all layers, plus the PP stage-to-stage sends
    head_s: float
    fixed_s: float  # forward_fixed + ops x kernel_overhead
    launch_floor_s: float  # ops x single_op_launch: the host's dispatch time in single-op mode

    def total_s(self, attention_layer_s: float) -> float:
        """The pass's total time with this attention core time per layer."""
        executed = self.layers * attention_layer_s + self.linear_s + self.collective_s + self.head_s
        if self.mode == "graph":
            return self.fixed_s + executed
        return self.fixed_s + max(executed, self.launch_floor_s)

    def cost(self, attention_layer_s: float) -> ForwardCost:
        attention = self.layers * attention_layer_s
        # Left to right, as sum() over the per-field totals did (moe/dispatch/combine are 0.0)
        executed = attention + self.linear_s + self.collective_s + self.head_s
        busy = executed if self.mode == "graph" else max(executed, self.launch_floor_s)
        total = self.fixed_s + busy
        return ForwardCost(
            mode=self.mode, attention_s=attention, linear_s=self.linear_s, moe_s=0.0,
            dispatch_s=0.0, combine_s=0.0, collective_s=self.collective_s, head_s=self.head_s,
            launch_s=total - executed, total_s=total,
        )  # fmt: skip


def is_dense_plan(m: ModelProfile, part: str) -> bool:
    """Whether every layer the pass runs is dense (then only attention depends on context)."""
    return all(not is_moe for is_moe, count in _layer_plan(m, part) if count)


@functools.lru_cache(maxsize=4096)  # exact-value key of frozen structs; ~1 KB an entry
def dense_fixed(
    m: ModelProfile, npu: NpuSpec, par: Parallel, span: Span, part: str, tokens: int,
    logits: int, graph: bool,
) -> DenseFixed:  # fmt: skip
    """The context-free part of a dense model's pass of `tokens` new tokens (`logits` positions
    needing logits, graph or single-op mode). The caller has validated the layout."""
    ((_, count),) = [kind for kind in _layer_plan(m, part) if kind[1]]
    layer = _dense_layer(m, npu, tokens, par, span)
    head = _head_linear_s(m, npu, logits, par)
    ops = count * (OPS_DENSE_LAYER + (OPS_MLA_EXTRA if m.mla else 0))
    if part == "mtp":  # the MTP module's projection joining hidden state and embedding
        head += _mtp_projection_s(m, npu, tokens)
    stage_link = group_link(par.tp * par.pp, span)
    stage_send = transfer_time_s(tokens * m.hidden_size * ACT_BYTES, stage_link)
    ops += OPS_HEAD
    return DenseFixed(
        mode="graph" if graph else "single_op",
        layers=count,
        linear_s=count * layer[0],
        collective_s=count * layer[1] + (par.pp - 1) * stage_send,
        head_s=head,
        fixed_s=npu.eff.forward_fixed_s + ops * npu.eff.kernel_overhead_s,
        launch_floor_s=ops * npu.eff.single_op_launch_s,
    )


def _dense_layer(
    m: ModelProfile, npu: NpuSpec, tokens: int, par: Parallel, span: Span
) -> tuple[float, float]:
    """(linear, collective) of one dense layer: _layer's arithmetic without attention."""
    proj = linear_time_s(
        attention_params(m) / par.tp, tokens, m.weight_dtype, npu,
        act_elems_per_token=4 * m.hidden_size,
    )  # fmt: skip
    ffn_local = m.intermediate_size / par.tp
    linear = proj + elementwise_time_s(m, tokens, ffn_local, npu)
    allreduce = allreduce_time_s(tokens * m.hidden_size * ACT_BYTES, par.tp, group_link(par.tp, span))
    linear += linear_time_s(
        dense_mlp_params(m) / par.tp, tokens, m.weight_dtype, npu,
        act_elems_per_token=m.hidden_size + 3 * ffn_local,
    )  # fmt: skip
    return linear, 2 * allreduce


# Pure functions of a frozen NpuSpec, called on every forward: cached by value.
_largest_cluster = functools.lru_cache(maxsize=64)(largest_cluster)
span_of = functools.lru_cache(maxsize=64)(span_for)


def forward_time(
    m: ModelProfile,
    npu: NpuSpec,
    batch: Batch,
    par: Parallel = Parallel(),  # noqa: B008 - frozen struct, safe as a default
    *,
    link: LinkSpec | Span | None = None,
    part: Literal["main", "mtp"] = "main",
) -> ForwardCost:
    """Time of one forward pass of `batch` (one DP group's batch) on the layout `par`.

    Decode-only batches run as a graph; a batch with any prefill chunk runs in single-op mode
    (xDeepServe §2.3). Each collective is priced on the links its ranks span (layout.py): by
    default the NPU's server (HCCS inside a Gen1 server, RoCE between servers; UB throughout
    a CloudMatrix384). An explicit `link` puts every collective on that one link."""
    validate(m, batch, par)
    # No cluster of this NPU kind holds more (predict() checks the actual cluster's size).
    check_layout(m, par, _largest_cluster(npu))
    if link is None:
        span = span_of(npu)
    else:
        span = link if isinstance(link, Span) else Span.single(link)
    if is_dense_plan(m, part):
        tokens, logits, graph = batch.tokens, logits_tokens(batch), is_graph_batch(batch)
        plan = dense_fixed(m, npu, par, span, part, tokens, logits, graph)
        return plan.cost(attention_core_time_s(m, batch.seqs, par.tp, npu))
    totals = dict.fromkeys(_Layer.__struct_fields__, 0.0)
    ops = 0
    for is_moe, count in _layer_plan(m, part):
        if count == 0:
            continue
        layer = _layer(m, npu, batch, par, span, is_moe)
        for field in _Layer.__struct_fields__:
            totals[field] += count * getattr(layer, field)
        per_layer = OPS_MOE_LAYER if is_moe else OPS_DENSE_LAYER
        ops += count * (per_layer + (OPS_MLA_EXTRA if m.mla else 0))
    head = _head_linear_s(m, npu, logits_tokens(batch), par)
    if part == "mtp":  # the MTP module's projection joining hidden state and embedding
        head += _mtp_projection_s(m, npu, batch.tokens)
    # Consecutive PP stages of TP groups: the pipeline leaves the server once tp x pp does.
    stage_link = group_link(par.tp * par.pp, span)
    stage_send = transfer_time_s(batch.tokens * m.hidden_size * ACT_BYTES, stage_link)
    totals["collective_s"] += (par.pp - 1) * stage_send
    ops += OPS_HEAD
    executed = sum(totals.values()) + head
    graph = is_graph_batch(batch)
    fixed = npu.eff.forward_fixed_s + ops * npu.eff.kernel_overhead_s
    busy = executed
    if not graph:  # the host dispatches op by op; the NPU idles when ops are shorter than that
        busy = max(executed, ops * npu.eff.single_op_launch_s)
    total = fixed + busy
    return ForwardCost(
        mode="graph" if graph else "single_op",
        head_s=head,
        launch_s=total - executed,
        total_s=total,
        **totals,
    )


def sampling_time_s(m: ModelProfile, npu: NpuSpec, positions: int) -> float:
    """Sampling over FP32 logits on the NPU plus the host sync that returns the tokens."""
    if positions < 1:
        raise ValueError(f"positions: must be >= 1, got {positions}")
    logits_bytes = positions * m.vocab_size * 4 * SAMPLING_PASSES
    kernels = op_time_s(0.0, logits_bytes, npu) + SAMPLING_OPS * npu.eff.kernel_overhead_s
    return kernels + npu.eff.sampling_fixed_s
