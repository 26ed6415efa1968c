"""A dense model's pass on the NPU by closed form: the checks a request passes first, and the
constants of its pass cost (cached by the few plain values they depend on).

`npu_run` prices a run's passes and a single forward with these; `forward_cost_s` (through
`compute.forward_time`) stays the reference they are tested against, float for float.
"""

from __future__ import annotations

import functools
import math

import msgspec

from deepserve.actors.ports.npu import NpuForward, NpuForwardRun, SeqShape
from deepserve.adapters.hardware.batch import GRAPH_MAX_NEW_TOKENS, Batch, Parallel, Seq, validate
from deepserve.adapters.hardware.compute import dense_fixed, is_dense_plan, sampling_time_s, span_of
from deepserve.adapters.hardware.dense_fixed_plan import DenseFixedPlan, dense_fixed_plan
from deepserve.adapters.hardware.devices.npu_loop import seq_sums
from deepserve.adapters.hardware.layout import check_layout, largest_cluster
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.roofline import ACT_BYTES
from deepserve.adapters.hardware.sizes import kv_bytes_per_token_layer
from deepserve.adapters.hardware.specs import npu_spec


@functools.lru_cache(maxsize=256)
def _dense_main(model: str) -> bool:
    m = model_profile(model)
    return m.mla is None and is_dense_plan(m, "main")


@functools.lru_cache(maxsize=256)  # a bad layout raises, and is not cached
def _layout_valid(model: str, par: Parallel) -> None:
    validate(model_profile(model), Batch(seqs=(Seq(1, 0),)), par)  # its layout checks


@functools.lru_cache(maxsize=256)
def _layout_fits(npu: str, model: str, par: Parallel) -> None:
    check_layout(model_profile(model), par, largest_cluster(npu_spec(npu)))


@functools.lru_cache(maxsize=256)
def closed_form_ok(
    npu: str, model: str, part: str, tp: int, pp: int, dp: int, ep: int, shared_expert_ranks: int,
    redundant_experts: int,
) -> bool:  # fmt: skip
    """Whether requests of this layout are a dense model's main part on a layout that passes
    both layout checks (then only their sequences can be refused). Keyed by the plain fields:
    building the `Parallel` and hashing it twice a request cost more than the checks' caches
    saved. False sends the request through `checked_dense`'s checks in forward_time's order."""
    if part != "main" or not _dense_main(model):
        return False
    par = Parallel(tp=tp, pp=pp, dp=dp, ep=ep, shared_expert_ranks=shared_expert_ranks,
                   redundant_experts=redundant_experts)  # fmt: skip
    try:
        _layout_valid(model, par)
        _layout_fits(npu, model, par)
    except (ValueError, KeyError):  # raised again, in order, by checked_dense
        return False
    return True


def checked_dense(npu: str, msg: NpuForward | NpuForwardRun, shapes: tuple[SeqShape, ...]) -> bool:
    """forward_time's checks of a pass of `shapes` on the request's layout, in its order (the
    layout against the model, the sequences, the layout against the largest cluster of this
    NPU kind), for a dense model's main part: True when they pass. False (nothing checked) for
    anything else, which the caller prices through `forward_cost_s` to check it."""
    if not closed_form_ok(npu, msg.model, msg.part, msg.tp, msg.pp, msg.dp, msg.ep,
                           msg.shared_expert_ranks, msg.redundant_experts):  # fmt: skip
        if msg.part != "main" or not _dense_main(msg.model):
            return False
        par = layout_of(msg)
        _layout_valid(msg.model, par)  # one of these raises, in this order
        _check_seqs(shapes)
        _layout_fits(npu, msg.model, par)
        return True
    _check_seqs(shapes)
    return True


def _check_seqs(shapes: tuple[SeqShape, ...]) -> None:
    if not shapes:
        raise ValueError("batch: must hold at least one sequence")
    for s in shapes:  # validate's message for a bad sequence
        if s.new_tokens < 1 or s.context_tokens < 0:
            seq = Seq(s.new_tokens, s.context_tokens)
            raise ValueError(f"batch: each seq needs new_tokens >= 1, context >= 0; got {seq}")


def layout_of(msg: NpuForward | NpuForwardRun) -> Parallel:
    return Parallel(
        tp=msg.tp, pp=msg.pp, dp=msg.dp, ep=msg.ep,
        shared_expert_ranks=msg.shared_expert_ranks, redundant_experts=msg.redundant_experts,
    )  # fmt: skip


def dense_terms(
    npu: str, msg: NpuForward | NpuForwardRun, seqs: tuple[SeqShape, ...] | None = None,
    check: bool = False,
) -> tuple[DenseConsts, tuple[int, int, int, int], bool] | None:  # fmt: skip
    """A dense run's constants (cached by the few values they depend on: hashing the request
    or the model's frozen profile cost more than the rest) and its integer sums: attended
    pairs and cached tokens at pass 0, their growth per pass (each sequence's context grows by
    its n new tokens: pairs by n*n), and the tokens of a pass; and whether the pass runs as a
    graph. None when not dense GQA. `seqs`: other shapes than the run's (a head or lead pass).
    `check`: raise `validate`'s error for the sequences first (as `_check_seqs`, in the same
    loop), for a layout `closed_form_ok` passed."""
    seqs = msg.seqs if seqs is None else seqs
    if check and not seqs:
        raise ValueError("batch: must hold at least one sequence")
    # One compiled loop for every sum (npu_loop.seq_sums; six generator reductions cost ~14k
    # instructions a call, the Python loop ~200 ns a sequence)
    bad, graph, tokens, logits, pairs0, dpairs, kv0 = seq_sums(seqs, GRAPH_MAX_NEW_TOKENS, check)
    if bad >= 0:  # validate's message for a bad sequence
        s = seqs[bad]
        raise ValueError(f"batch: each seq needs new_tokens >= 1, context >= 0; got {Seq(s.new_tokens, s.context_tokens)}")
    c = _dense_consts(npu, msg.model, msg.part, msg.tp, msg.pp, msg.dp, msg.ep,
                      msg.shared_expert_ranks, msg.redundant_experts, tokens, logits, graph,
                      msg.sample)  # fmt: skip
    if c is None:
        return None
    return c, (pairs0, dpairs, kv0, tokens), graph


def seq_sums_reference(
    seqs: tuple[SeqShape, ...], graph_max: int, check: bool
) -> tuple[int, bool, int, int, int, int, int]:  # fmt: skip
    """`npu_loop.seq_sums`, readable: one reduction a sum (tests/adapters/test_npu_seq_sums.py)."""
    if check:  # the sums before the first bad sequence, beside its index
        bad = next((i for i, s in enumerate(seqs) if s.new_tokens < 1 or s.context_tokens < 0), -1)
        if bad >= 0:
            return (bad, *seq_sums_reference(seqs[:bad], graph_max, False)[1:])
    ns = [s.new_tokens for s in seqs]
    return (
        -1, all(n <= graph_max for n in ns), sum(ns), sum(min(n, graph_max) for n in ns),
        sum(n * s.context_tokens + n * (n + 1) // 2 for n, s in zip(ns, seqs, strict=True)),
        sum(n * n for n in ns), sum(s.context_tokens + n for n, s in zip(ns, seqs, strict=True)),
    )


class DenseConsts(msgspec.Struct, frozen=True):
    """The context-free constants of a dense run's pass (DensePlan's, without the sums)."""

    fixed: float
    layers: int
    linear: float
    collective: float
    head: float
    floor: float
    sampling: float | None
    flops_per_pair: float
    kv_layer: float
    q_bytes: float
    peak: float
    bw: float
    loop: tuple[float, ...]  # the same, as npu_loop.dense_ends takes them


class _Layout(msgspec.Struct, frozen=True):
    """What a dense layout's pass constants share whatever the pass's shape."""

    model: str
    npu: str
    part: str
    par: Parallel
    plan: DenseFixedPlan | None  # the main part's; an MTP part calls dense_fixed
    flops_per_pair: float
    kv_layer: float
    q_per_token: float  # 2 * heads * head_dim * ACT_BYTES: q in, output out
    peak: float
    bw: float


@functools.lru_cache(maxsize=256)
def _dense_layout(
    npu: str, model: str, part: str, tp: int, pp: int, dp: int, ep: int, shared_expert_ranks: int,
    redundant_experts: int,
) -> _Layout | None:  # fmt: skip
    """A dense GQA layout's shape-independent constants, None when its pass is not that."""
    m = model_profile(model)
    if m.mla is not None or not is_dense_plan(m, part):
        return None
    spec = npu_spec(npu)
    par = Parallel(tp=tp, pp=pp, dp=dp, ep=ep, shared_expert_ranks=shared_expert_ranks,
                   redundant_experts=redundant_experts)  # fmt: skip
    plan = dense_fixed_plan(m, spec, par, span_of(spec)) if part == "main" else None
    # _gqa_core's constants, computed as it computes them
    heads = m.n_heads / par.tp
    kv_layer = kv_bytes_per_token_layer(m) * (math.ceil(m.n_kv_heads / par.tp) / m.n_kv_heads)
    return _Layout(
        model, npu, part, par, plan, flops_per_pair=2 * heads * (2 * m.head_dim), kv_layer=kv_layer,
        q_per_token=2 * heads * m.head_dim * ACT_BYTES,
        peak=spec.tflops_fp16 * spec.eff.compute,  # op_time_s's denominators
        bw=spec.hbm_bw_bytes_per_s * spec.eff.memory,
    )  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _dense_consts(
    npu: str, model: str, part: str, tp: int, pp: int, dp: int, ep: int, shared_expert_ranks: int,
    redundant_experts: int, tokens: int, logits: int, graph: bool, sample: bool,
) -> DenseConsts | None:  # fmt: skip
    lay = _dense_layout(npu, model, part, tp, pp, dp, ep, shared_expert_ranks, redundant_experts)
    if lay is None:
        return None
    if lay.plan is not None:  # dense_fixed's and sampling_time_s's floats, from the plan
        plan = lay.plan
        layers, fixed_s, launch_floor_s = plan.layers, plan.fixed_s, plan.launch_floor_s
        linear_s, collective_s, head_s = plan.fixed(tokens, logits)
        sampling = plan.sampling(logits) if sample else None
    else:
        m, spec = model_profile(model), npu_spec(npu)
        fx = dense_fixed(m, spec, lay.par, span_of(spec), part, tokens, logits, graph)
        layers, fixed_s, launch_floor_s = fx.layers, fx.fixed_s, fx.launch_floor_s
        linear_s, collective_s, head_s = fx.linear_s, fx.collective_s, fx.head_s
        sampling = sampling_time_s(m, spec, logits) if sample else None
    floor = 0.0 if graph else launch_floor_s
    q_bytes = lay.q_per_token * tokens
    loop = (fixed_s, float(layers), linear_s, collective_s, head_s, floor,
            -1.0 if sampling is None else sampling, lay.flops_per_pair, lay.kv_layer, q_bytes,
            lay.peak, lay.bw)  # fmt: skip
    return DenseConsts(fixed_s, layers, linear_s, collective_s, head_s, floor, sampling,
                       lay.flops_per_pair, lay.kv_layer, q_bytes, lay.peak, lay.bw, loop)  # fmt: skip
