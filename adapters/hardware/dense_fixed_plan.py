"""`compute.dense_fixed` and `compute.sampling_time_s` of a dense model's main part, with their
token-independent terms computed once per (model, NPU, layout, links).

The NPU prices a pass of a new shape (a prefill chunk, a run's head) about once a simulated
request, and `dense_fixed` then spent ~30k instructions in calls (linear_time_s, op_time_s,
allreduce_time_s, ...) whose operands mostly do not depend on the shape. `DenseFixedPlan` keeps
those operands; `fixed` and `sampling` perform the remaining operations of the same
expressions, one IEEE operation each, in the order Python evaluates the originals: a constant
here is always a subexpression the original evaluates first (its left operand, or a
parenthesised term), so every result is the same float (tests compare them bit for bit).
"""

from __future__ import annotations

from msgspec import Struct

from deepserve.adapters.hardware.batch import Parallel
from deepserve.adapters.hardware.compute import (
    OPS_DENSE_LAYER,
    OPS_HEAD,
    SAMPLING_OPS,
    SAMPLING_PASSES,
)
from deepserve.adapters.hardware.layout import Span, group_link
from deepserve.adapters.hardware.models import ModelProfile
from deepserve.adapters.hardware.roofline import ACT_BYTES, ELEMENTWISE_HIDDEN_PASSES
from deepserve.adapters.hardware.sizes import (
    attention_params,
    dense_layers,
    dense_mlp_params,
    dtype_bytes,
    head_params,
)
from deepserve.adapters.hardware.specs import NpuSpec
from deepserve.adapters.hardware.transfer import effective_bw_bytes_per_s


class DenseFixedPlan(Struct, frozen=True):
    """dense_fixed's operands that do not depend on the pass's tokens (names as there)."""

    layers: int  # count: decoder layers of the main part
    att_flops: float  # linear_time_s of the attention projections: 2.0 * params
    att_bytes: float  # params * dtype_bytes(weight_dtype)
    att_act: int  # act_elems_per_token
    mlp_flops: float  # the same three of the MLP
    mlp_bytes: float
    mlp_act: float
    ew_elems: float  # elementwise_time_s: its elements per token
    weight_peak: float  # op_time_s's denominators: the weights' peak (INT8 or FP16) x eff
    fp16_peak: float
    memory_bw: float
    hidden: int
    ar_ranks: int  # allreduce_time_s over the TP group (0.0 when tp == 1)
    ar_fixed: float  # 2 * (latency + per-message)
    ar_share: float  # 2 * (ranks - 1) / ranks
    ar_bw: float
    head_flops: float  # linear_time_s of the LM head (bf16)
    head_bytes: float
    head_act: float
    stage_fixed: float  # transfer_time_s of a PP stage send: latency + 1 * per-message
    stage_bw: float
    stages_after: int  # pp - 1
    fixed_s: float
    launch_floor_s: float
    sampling_bytes: int  # sampling_time_s: logits bytes per position
    sampling_ops_s: float
    sampling_fixed_s: float

    def fixed(self, tokens: int, logits: int) -> tuple[float, float, float]:
        """(linear_s, collective_s, head_s) of dense_fixed for a pass of `tokens` new tokens
        with `logits` positions; fixed_s and launch_floor_s are the plan's."""
        # _dense_layer: the projections, elementwise ops and MLP (op_time_s's max: the first
        # operand unless the second is larger, as Python's max)
        compute = self.att_flops * tokens / self.weight_peak
        memory = (self.att_bytes + tokens * self.att_act * ACT_BYTES) / self.memory_bw
        linear = memory if memory > compute else compute
        memory = tokens * self.ew_elems * ACT_BYTES / self.memory_bw
        linear = linear + (memory if memory > 0.0 else 0.0)
        compute = self.mlp_flops * tokens / self.weight_peak
        memory = (self.mlp_bytes + tokens * self.mlp_act * ACT_BYTES) / self.memory_bw
        linear += memory if memory > compute else compute
        act_bytes = tokens * self.hidden * ACT_BYTES
        allreduce = 0.0
        if self.ar_ranks != 1:
            allreduce = self.ar_fixed + self.ar_share * act_bytes / self.ar_bw
        compute = self.head_flops * logits / self.fp16_peak
        memory = (self.head_bytes + logits * self.head_act * ACT_BYTES) / self.memory_bw
        head = memory if memory > compute else compute
        stage_send = self.stage_fixed + act_bytes / self.stage_bw
        collective = self.layers * (2 * allreduce) + self.stages_after * stage_send
        return self.layers * linear, collective, head

    def sampling(self, logits: int) -> float:
        """sampling_time_s of `logits` positions (>= 1: a pass has at least one sequence)."""
        memory = logits * self.sampling_bytes / self.memory_bw
        return (memory if memory > 0.0 else 0.0) + self.sampling_ops_s + self.sampling_fixed_s


def dense_fixed_plan(m: ModelProfile, npu: NpuSpec, par: Parallel, span: Span) -> DenseFixedPlan:
    """The plan of a dense, non-MLA model's main part on this layout (validated by the caller)."""
    eff = npu.eff
    wbytes = dtype_bytes(m.weight_dtype)
    att = attention_params(m) / par.tp
    ffn_local = m.intermediate_size / par.tp
    mlp = dense_mlp_params(m) / par.tp
    head = head_params(m) / par.tp
    link = group_link(par.tp, span)
    stage = group_link(par.tp * par.pp, span)
    ops = dense_layers(m) * OPS_DENSE_LAYER + OPS_HEAD
    return DenseFixedPlan(
        layers=dense_layers(m), att_flops=2.0 * att, att_bytes=att * wbytes,
        att_act=4 * m.hidden_size, mlp_flops=2.0 * mlp, mlp_bytes=mlp * wbytes,
        mlp_act=m.hidden_size + 3 * ffn_local,
        ew_elems=ELEMENTWISE_HIDDEN_PASSES * m.hidden_size + 3 * ffn_local,
        weight_peak=(npu.tops_int8 if m.weight_dtype == "int8" else npu.tflops_fp16) * eff.compute,
        fp16_peak=npu.tflops_fp16 * eff.compute, memory_bw=npu.hbm_bw_bytes_per_s * eff.memory,
        hidden=m.hidden_size, ar_ranks=par.tp, ar_fixed=2 * (link.latency_s + link.per_message_s),
        ar_share=2 * (par.tp - 1) / par.tp,
        ar_bw=effective_bw_bytes_per_s(link) * min(link.ports, par.tp - 1),
        head_flops=2.0 * head, head_bytes=head * dtype_bytes("bf16"),
        head_act=m.hidden_size + m.vocab_size / par.tp,
        stage_fixed=stage.latency_s + 1 * stage.per_message_s,
        stage_bw=effective_bw_bytes_per_s(stage), stages_after=par.pp - 1,
        fixed_s=eff.forward_fixed_s + ops * eff.kernel_overhead_s,
        launch_floor_s=ops * eff.single_op_launch_s,
        sampling_bytes=m.vocab_size * 4 * SAMPLING_PASSES,
        sampling_ops_s=SAMPLING_OPS * eff.kernel_overhead_s, sampling_fixed_s=eff.sampling_fixed_s,
    )  # fmt: skip
