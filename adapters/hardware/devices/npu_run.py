"""Aggregated decode runs on the NPU (`NpuForwardRun`): the simulation's fast path.

A run is `iterations` forward passes of one batch whose sequences each append their new tokens
after every pass, separated by the host's launch gap. Every pass's duration is the performance
model's for exactly that pass's shapes (the same `forward_cost_s` a single NpuForward gets) times
its own variance factor, so a run is the same timeline as the passes sent one by one — in one
request, one answer and a few events instead of three messages and three events per pass. Passes
are drawn in doubling chunks as the run proceeds, so a run truncated early costs little.

A run may start with a `head`: pass 0 of other shapes (prefill chunks that complete their
prompts), priced as a forward of them; every pass after it decodes. The master sends one when
a prompt's last chunk would otherwise be a forward of its own followed by a run.
"""

from __future__ import annotations

import msgspec
import numpy as np
from numpy.typing import NDArray

from deepserve.actors.ports.npu import NpuForward, NpuForwardRun, SeqShape
from deepserve.adapters.hardware.batch import GRAPH_MAX_NEW_TOKENS, Batch, Seq
from deepserve.adapters.hardware.compute import forward_time, sampling_time_s
from deepserve.adapters.hardware.devices.npu_dense import (
    checked_dense,
    closed_form_ok,
    dense_terms,
    layout_of,
)
from deepserve.adapters.hardware.devices.npu_draws import factor_list, factors_of, run_ends
from deepserve.adapters.hardware.devices.npu_loop import dense_ends
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.specs import npu_spec

MAX_RUN_ITERATIONS = 100_000  # a limit on everything: one run's passes


def check_run(msg: NpuForwardRun) -> str | None:
    """Why a run request is malformed, or None."""
    if not 1 <= msg.iterations <= MAX_RUN_ITERATIONS:
        return f"iterations: must be in [1, {MAX_RUN_ITERATIONS}], got {msg.iterations}"
    if not msg.gap_s >= 0.0:
        return f"gap_s: must be >= 0, got {msg.gap_s}"
    if msg.head and len(msg.head) != len(msg.seqs):
        return f"head: one shape per sequence of seqs ({len(msg.seqs)}), got {len(msg.head)}"
    if msg.lead and not msg.head:
        return "lead: needs a head (pass 0's shapes)"
    if msg.lead and any(not shapes for shapes in msg.lead):  # (no generator for no lead)
        return "lead: every pass needs at least one sequence"
    return None


def pass_shapes(msg: NpuForwardRun, i: int) -> tuple[SeqShape, ...]:
    """The batch of pass i: every sequence has appended i times its new tokens."""
    return tuple(SeqShape(s.new_tokens, s.context_tokens + i * s.new_tokens) for s in msg.seqs)


# Passes drawn when a run starts; each further chunk doubles (<= 2x waste). The trade: a
# pass drawn and not run costs ~1 us (pricing and its variance factor), an extension costs
# a timer delivery and an `NpuRunExtended` event (~100 us with the log on). On the first
# 2,000 Mooncake requests (16 TEs), 32 -> 128 drew 8 % more passes and took 12 % fewer
# deliveries (36,049 -> 31,563); the simulating process ran ~5 % fewer instructions, log
# on or off (docs/sim.md).
FIRST_CHUNK = 128


def next_chunk(done: int, limit: int) -> int:
    """How many more passes to draw: a run truncated early wastes little, a long one costs a
    few extra deliveries (128, 128, 256, 512, ... passes)."""
    want = done if done > FIRST_CHUNK else FIRST_CHUNK  # min/max without the builtins' calls
    return want if want < limit - done else limit - done


def forward_cost_s(npu: str, msg: NpuForward | NpuForwardRun) -> tuple[float, str, int]:
    """(expected duration, mode, tokens) of a forward from the performance model."""
    m, spec = model_profile(msg.model), npu_spec(npu)
    batch = Batch(seqs=tuple(Seq(s.new_tokens, s.context_tokens) for s in msg.seqs))
    cost = forward_time(m, spec, batch, layout_of(msg), part=msg.part)
    total = cost.total_s
    if msg.sample:
        total += sampling_time_s(m, spec, _logits(msg.seqs))
    return total, cost.mode, batch.tokens


def check_run_cost(npu: str, msg: NpuForwardRun) -> tuple[float, ...] | None:
    """Raise what `forward_cost_s` raises for the run's first pass, without pricing it (the NPU
    prices a run pass by pass as it draws them). For a dense model's main part these are
    forward_time's checks, in its order: the layout against the model, the sequences, the
    layout against the largest cluster of this NPU kind; anything else is priced to be checked.
    Returns the head's and the lead's costs (priced to check them; `pass_costs` takes them),
    None without a head."""
    head_s = head_costs(npu, msg) if msg.head else None  # pass 0's (and the lead's) own shapes
    if not checked_dense(npu, msg, msg.seqs):
        forward_cost_s(npu, msg)
    return head_s


def _logits(seqs: tuple[SeqShape, ...]) -> int:  # batch.logits_tokens on the port's shapes
    return sum(min(s.new_tokens, GRAPH_MAX_NEW_TOKENS) for s in seqs)


def run_shape(msg: NpuForwardRun) -> tuple[str, int]:
    """(mode, tokens) of every pass of a run (new tokens per sequence do not change)."""
    graph, tokens = True, 0  # one loop (all() and sum() over generators cost ~3k instructions)
    for s in msg.seqs:
        tokens += s.new_tokens
        if s.new_tokens > GRAPH_MAX_NEW_TOKENS:
            graph = False
    return ("graph" if graph else "single_op"), tokens


class DensePlan(msgspec.Struct, frozen=True):
    """A dense GQA run's constants: pass i costs `fixed + max(layers x attention_i + linear +
    collective + head, floor) [+ sampling]`, attention_i the roofline max of
    `flops_per_pair x (pairs0 + i x dpairs) / peak` and `(kv_layer x (kv0 + i x tokens) +
    q_bytes) / bw` (see pass_costs)."""

    fixed: float
    layers: int
    linear: float
    collective: float
    head: float
    floor: float  # the launch floor in single-op mode; 0.0 in graph mode (executed >= 0)
    sampling: float | None
    flops_per_pair: float
    pairs0: int
    dpairs: int
    kv_layer: float
    kv0: int
    tokens: int
    q_bytes: float
    peak: float
    bw: float


def dense_plan(npu: str, msg: NpuForwardRun) -> DensePlan | None:
    """The run's constants, or None when its passes are not dense GQA (priced pass by pass)."""
    terms = dense_terms(npu, msg)
    if terms is None:
        return None
    c, (pairs0, dpairs, kv0, tokens), _ = terms
    return DensePlan(
        fixed=c.fixed, layers=c.layers, linear=c.linear, collective=c.collective, head=c.head,
        floor=c.floor, sampling=c.sampling, flops_per_pair=c.flops_per_pair, pairs0=pairs0,
        dpairs=dpairs, kv_layer=c.kv_layer, kv0=kv0, tokens=tokens, q_bytes=c.q_bytes,
        peak=c.peak, bw=c.bw,
    )  # fmt: skip


def head_request(msg: NpuForwardRun, shapes: tuple[SeqShape, ...]) -> NpuForwardRun:
    """One pass of a run's head or lead, as a one-pass request of its own shapes."""
    return msgspec.structs.replace(msg, seqs=shapes, head=(), lead=(), iterations=1)


# Not cached: the NPU keeps the value it checked a run with (`Npu._head_costed`) for its start,
# and no two runs share a head (a cache by the request's value hit 0 of 921 times, and hashing
# the request cost ~5k instructions)
def head_costs(npu: str, msg: NpuForwardRun) -> tuple[float, ...]:
    """The durations of pass 0 and the lead's passes from the model (raises what
    `forward_cost_s` raises; not cached then)."""
    if not msg.lead:  # (a tuple of a generator costs ~1.5k instructions more)
        return (_pass_priced(npu, msg, msg.head)[0],)
    return tuple([_pass_priced(npu, msg, p)[0] for p in (msg.head, *msg.lead)])


def forward_cost_fast(npu: str, msg: NpuForward) -> tuple[float, str, int]:
    """`forward_cost_s(npu, msg)`, the same floats and errors: a dense model's main part is
    priced by the run's closed form at pass 0 (`_pass_priced`)."""
    cost, graph, tokens = _pass_priced(npu, msg, msg.seqs)
    return cost, "graph" if graph else "single_op", tokens


def _pass_priced(
    npu: str, msg: NpuForward | NpuForwardRun, shapes: tuple[SeqShape, ...]
) -> tuple[float, bool, int]:
    """`forward_cost_s` of one pass of these shapes on the request's layout: (duration, graph
    mode, tokens). A dense model's main part is priced by the run's closed form at its pass 0
    (the same floats: the body's passes are those of forward_cost_s, test_npu_run), after
    forward_time's checks in its order (for a layout known to pass both layout checks, only
    the sequences' checks, done in dense_terms' loop)."""
    if closed_form_ok(npu, msg.model, msg.part, msg.tp, msg.pp, msg.dp, msg.ep,
                      msg.shared_expert_ranks, msg.redundant_experts):  # fmt: skip
        terms = dense_terms(npu, msg, shapes, check=True)
    else:
        terms = dense_terms(npu, msg, shapes) if checked_dense(npu, msg, shapes) else None
    if terms is None or terms[1][0] >= _FLOAT_EXACT or terms[1][2] >= _FLOAT_EXACT:
        one = msg if isinstance(msg, NpuForward) else head_request(msg, shapes)
        cost, mode, tokens = forward_cost_s(npu, one)
        return cost, mode == "graph", tokens
    consts, (pairs0, dpairs, kv0, tokens), graph = terms
    ends = dense_ends([], consts.loop, (0, 1, pairs0, dpairs, kv0, tokens), 0.0, 0.0, None, [])
    return ends[0], graph, tokens


def pass_costs(
    npu: str, msg: NpuForwardRun, lo: int, hi: int, head_s: tuple[float, ...] | None = None
) -> NDArray[np.float64]:
    """The performance model's duration of passes lo..hi-1 of the run (the request validated).
    With a `head`, pass 0 and the lead's passes are each priced as a forward of their shapes
    (`forward_cost_s`, as a single NpuForward of them would be; `head_s` if given, `head_costs`'
    value already known) and pass i > len(lead) as pass i - 1 - len(lead) of `seqs`."""
    if not msg.head:
        return _body_costs(npu, msg, lo, hi)
    p = 1 + len(msg.lead)
    body = _body_costs(npu, msg, max(lo, p) - p, hi - p) if hi > max(lo, p) else _NONE
    if lo < p and lo < hi:
        pre = (head_costs(npu, msg) if head_s is None else head_s)[lo : min(hi, p)]
        return np.concatenate((pre, body))
    return body


_NONE: NDArray[np.float64] = np.empty(0, dtype=np.float64)
# Integer sums below this are exact in int64 and in the float conversion's input (a guard: the
# sums of any run a 910B/910C holds are far below it; beyond it the pass-by-pass path prices).
_INT_LIMIT = 1 << 62
_FLOAT_EXACT = 1 << 53  # the compiled loop steps the sums as floats: exact below this


def _body_costs(npu: str, msg: NpuForwardRun, lo: int, hi: int) -> NDArray[np.float64]:
    """The performance model's duration of passes lo..hi-1 of `msg.seqs` (no head).

    For a dense GQA model only the attention core depends on the context, and its FLOPs and
    bytes are linear in the sequences' summed attended pairs and cached tokens, which grow by
    fixed integers each pass. So pass i costs the shape's context-free part (`dense_fixed`,
    cached) plus a roofline max over two affine terms, computed for the whole chunk on arrays.
    The sums are kept in integers and the float operations are forward_time's, in its order
    (numpy's elementwise products, quotients and maxima are the IEEE operations Python does), so
    a pass's cost is the same float as `forward_cost_s` of its shapes whenever the attention
    sums are exact in binary floating point (integers below 2^53: every dense model of models.py
    at any context a 910B/910C holds; test_npu_run checks bit equality); otherwise equal up to
    float rounding. Anything else (MoE, MLA) is computed pass by pass."""
    p = dense_plan(npu, msg)
    last = hi - 1
    if p is None or max(p.pairs0 + last * p.dpairs, p.kv0 + last * p.tokens) >= _INT_LIMIT:
        return np.array([
            forward_cost_s(npu, msgspec.structs.replace(msg, seqs=pass_shapes(msg, i)))[0]
            for i in range(lo, hi)
        ], dtype=np.float64)  # fmt: skip
    # The integer sums of passes lo..hi-1 (exact: both stay below _INT_LIMIT), one arange each
    pairs: NDArray[np.int64] = np.arange(p.pairs0 + lo * p.dpairs, p.pairs0 + hi * p.dpairs, p.dpairs, dtype=np.int64)
    cached: NDArray[np.int64] = np.arange(p.kv0 + lo * p.tokens, p.kv0 + hi * p.tokens, p.tokens, dtype=np.int64)
    assert len(pairs) == len(cached) == hi - lo
    # op_time_s's max(compute, memory), then forward_time's layers x core + linear + collective
    # + head and max(executed, launch floor): maxima of positive floats, as Python's `max` keeps
    compute = p.flops_per_pair * pairs / p.peak
    memory = p.kv_layer * cached
    memory += p.q_bytes
    memory /= p.bw
    x = np.maximum(compute, memory, out=compute)
    x *= p.layers
    x += p.linear
    x += p.collective
    x += p.head
    if p.floor > 0.0:  # graph mode has none: max(x, 0.0) is x for the positive x here
        np.maximum(x, p.floor, out=x)
    cost = np.add(p.fixed, x, out=x)  # fixed + busy, then + sampling (forward_cost_s's order)
    if p.sampling is not None:
        cost += p.sampling
    return cost


def chunk_ends(
    npu: str, msg: NpuForwardRun, lo: int, hi: int, start_s: float,
    head_s: tuple[float, ...] | None, raw: bytes | None,
) -> tuple[float, ...]:  # fmt: skip
    """When passes lo..hi-1 of the run end, each its model cost (`pass_costs`) times its
    variance factor (`raw`: the chunk's picks, `npu_draws.factor_picks_raw`; None: variance
    off), pass i+1 starting `gap_s` after pass i ends. A dense run's chunk is one compiled
    loop (`npu_loop.dense_ends`); anything else goes through the arrays (same floats)."""
    p = 1 + len(msg.lead) if msg.head else 0  # passes priced as forwards of their own
    b_lo, b_hi = (lo - p if lo > p else 0), hi - p  # (builtin max/min calls cost ~1k each)
    terms = dense_terms(npu, msg)
    if terms is not None:
        consts, (pairs0, dpairs, kv0, tokens), _ = terms
        if pairs0 + (b_hi - 1) * dpairs < _FLOAT_EXACT and kv0 + (b_hi - 1) * tokens < _FLOAT_EXACT:
            pre: list[float] = []
            if lo < p:
                pre = list((head_costs(npu, msg) if head_s is None else head_s)[lo : hi if hi < p else p])
            n = b_hi - b_lo
            ints = (b_lo, n if n > 0 else 0, pairs0, dpairs, kv0, tokens)
            return tuple(dense_ends(pre, consts.loop, ints, start_s, msg.gap_s, raw, factor_list()))
    factors = factors_of(raw) if raw is not None else None
    return run_ends(msg.gap_s, start_s, pass_costs(npu, msg, lo, hi, head_s), factors)
