"""Aggregated decode runs on the NPU (`NpuForwardRun`): the simulation's fast path.

A run is `iterations` forward passes of one batch whose sequences each append their new tokens
after every pass, separated by the host's launch gap. Every pass's duration is the performance
model's for exactly that pass's shapes (the same `forward_cost_s` a single NpuForward gets) times
its own variance draw, so a run is the same timeline as the passes sent one by one — in one
request, one answer and a few events instead of three messages and three events per pass. Passes
are drawn in doubling chunks as the run proceeds, so a run truncated early costs little.
"""

from __future__ import annotations

from collections.abc import Callable

from deepserve.actors.ports.npu import NpuForwardRun, SeqShape
from deepserve.adapters.hardware.batch import GRAPH_MAX_NEW_TOKENS, Seq
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.roofline import _gqa_core, op_time_s
from deepserve.adapters.hardware.sizes import dense_layers
from deepserve.adapters.hardware.specs import npu_spec

MAX_RUN_ITERATIONS = 100_000  # a limit on everything: one run's passes


def check_run(msg: NpuForwardRun) -> str | None:
    """Why a run request is malformed, or None."""
    if not 1 <= msg.iterations <= MAX_RUN_ITERATIONS:
        return f"iterations: must be in [1, {MAX_RUN_ITERATIONS}], got {msg.iterations}"
    if not msg.gap_s >= 0.0:
        return f"gap_s: must be >= 0, got {msg.gap_s}"
    return None


def pass_shapes(msg: NpuForwardRun, i: int) -> tuple[SeqShape, ...]:
    """The batch of pass i: every sequence has appended i times its new tokens."""
    return tuple(SeqShape(s.new_tokens, s.context_tokens + i * s.new_tokens) for s in msg.seqs)


FIRST_CHUNK = 32  # passes drawn when a run starts; each further chunk doubles (<= 2x waste)


def next_chunk(done: int, limit: int) -> int:
    """How many more passes to draw: a run truncated early wastes little, a long one costs a
    few extra deliveries (32, 64, 128, ... passes)."""
    return min(limit - done, max(FIRST_CHUNK, done))


def pass_costs(
    npu: str, msg: NpuForwardRun, cost_s: Callable[[tuple[SeqShape, ...]], float], lo: int, hi: int
) -> list[float]:
    """The performance model's duration of passes lo..hi-1 of the run.

    For a dense GQA model's decode graph (the common case) only the attention core depends on
    the context, and linearly in FLOPs and bytes, so pass i costs pass 0's time plus the layers'
    change of one roofline term — O(1) a pass instead of a whole forward_time. Equal to calling
    the model pass by pass up to float rounding (checked by test_npu_run). Anything else (MoE,
    MLA, prefill chunks, MTP) is computed pass by pass."""
    m = model_profile(msg.model)
    closed = (
        hi - lo > 1 and m.moe is None and m.mla is None and msg.part == "main"
        and all(s.new_tokens <= GRAPH_MAX_NEW_TOKENS for s in msg.seqs)
    )  # fmt: skip
    if not closed:
        return [cost_s(pass_shapes(msg, i)) for i in range(lo, hi)]
    first = cost_s(pass_shapes(msg, 0))
    spec = npu_spec(npu)
    f0, b0 = _gqa_core(m, [Seq(s.new_tokens, s.context_tokens) for s in msg.seqs], msg.tp)
    f1, b1 = _gqa_core(m, [Seq(s.new_tokens, s.context_tokens) for s in pass_shapes(msg, 1)], msg.tp)
    df, db = f1 - f0, b1 - b0
    layers = dense_layers(m)
    a0 = op_time_s(f0, b0, spec)
    # op_time_s inlined (the same arithmetic): this loop runs once per simulated decode pass
    peak, bw = spec.tflops_fp16 * spec.eff.compute, spec.hbm_bw_bytes_per_s * spec.eff.memory
    return [
        first if i == 0 else first + layers * (max((f0 + i * df) / peak, (b0 + i * db) / bw) - a0)
        for i in range(lo, hi)
    ]


def run_times(
    gap_s: float,
    start_s: float,
    costs_s: list[float],
    factor: Callable[[], float],
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(starts, ends) of consecutive passes: pass i+1 starts `gap_s` after pass i ends. The
    arithmetic is the stepwise path's (end = start + duration; next start = end + gap)."""
    starts: list[float] = []
    ends: list[float] = []
    t = start_s
    for cost in costs_s:
        starts.append(t)
        end = t + cost * factor()
        ends.append(end)
        t = end + gap_s
    return tuple(starts), tuple(ends)


def truncation_point(ends_s: tuple[float, ...], now: float) -> int:
    """How many passes a run keeps when truncated at `now`: up to the first pass ending at or
    after `now` (the one running, or the one about to start after a gap)."""
    for i, end in enumerate(ends_s):
        if end >= now:
            return i + 1
    return len(ends_s)
