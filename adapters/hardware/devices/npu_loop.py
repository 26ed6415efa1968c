"""A dense run chunk's pass ends in one loop, compiled by mypyc (`compiled.py`, group "npu").

A run chunk (128 passes first, then doubling) used to take ~30 numpy calls: the affine cost
terms, their roofline maximum and sums, the variance factors' table lookup, the interleaved
running sum of ends. Each call costs ~6k instructions on arrays this small, ~175k a chunk; the
same arithmetic as C doubles in one compiled loop costs a few dozen instructions a pass. The
floats are the same: every step is one IEEE operation in the order `npu_run._body_costs` and
`npu_draws.run_ends` perform them (x86-64's baseline has no FMA, so nothing is contracted), and
without the compiled build this module runs as plain Python, which gives the same floats too
(tests/adapters/test_npu_cost_path.py checks the loop against the array path bit for bit).

Only plain numbers cross this boundary (the plan's fields are read by the caller): mypyc reads
msgspec Structs through a generic getattr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deepserve.actors.ports.npu import SeqShape


def seq_sums(
    seqs: tuple[SeqShape, ...], graph_max: int, check: bool
) -> tuple[int, bool, int, int, int, int, int]:  # fmt: skip
    """`npu_dense.dense_terms`' loop over a pass's sequences (its readable version beside it,
    `seq_sums_reference`): (-1, or with `check` the index of the first sequence with
    new_tokens < 1 or context < 0; whether the pass runs as a graph (no sequence over
    `graph_max` new tokens); tokens; logits (each sequence's n capped at `graph_max`); attended
    pairs at pass 0; their growth a pass; cached tokens at pass 0)."""
    graph, tokens, logits, pairs0, dpairs, kv0 = True, 0, 0, 0, 0, 0
    i = 0
    for s in seqs:
        n = s.new_tokens
        ctx = s.context_tokens
        if check and (n < 1 or ctx < 0):
            return i, graph, tokens, logits, pairs0, dpairs, kv0
        if n > graph_max:
            graph = False
        tokens += n
        logits += n if n < graph_max else graph_max
        pairs0 += n * ctx + n * (n + 1) // 2
        dpairs += n * n
        kv0 += ctx + n
        i += 1
    return -1, graph, tokens, logits, pairs0, dpairs, kv0


def dense_ends(
    pre: list[float], body: tuple[float, ...], ints: tuple[int, int, int, int, int, int],
    start_s: float, gap_s: float, raw: bytes | None, table: list[float],
) -> list[float]:  # fmt: skip
    """When each pass of a chunk ends. `pre`: the model costs of the chunk's first passes that
    are priced as forwards of their own (a run's head and lead); then `n` body passes from pass
    `lo` of the dense plan: `body` = (fixed, layers, linear, collective, head, floor, sampling,
    flops_per_pair, kv_layer, q_bytes, peak, bw; sampling < 0: none) and `ints` = (lo, n,
    pairs0, dpairs, kv0, tokens), each sum below 2**53 (exact as a float). `raw`: the chunk's
    16-bit little-endian factor picks into `table` (None: variance off). Pass i+1 starts
    `gap_s` after pass i ends."""
    fixed, layers, linear, collective, head, floor, sampling = body[:7]
    flops_per_pair, kv_layer, q_bytes, peak, bw = body[7:]
    lo, n, pairs0, dpairs, kv0, tokens = ints
    varied = raw is not None
    picks = raw if raw is not None else b""
    npre = len(pre)
    # Filled in place (appending cost ~30 instructions a pass more, and reallocations)
    ends: list[float] = [0.0] * (npre + n)
    s = start_s
    k = 0  # byte offset of the next pass's pick
    for i in range(npre):  # the head and lead passes: priced as forwards of their own
        d = pre[i]
        if varied:
            d = d * table[picks[k] | (picks[k + 1] << 8)]
        e = s + d
        ends[i] = e
        s = e + gap_s
        k += 2
    # The integer sums as floats, stepped by exact additions (every value is below 2**53)
    pairs, dp = float(pairs0 + lo * dpairs), float(dpairs)
    cached, dc = float(kv0 + lo * tokens), float(tokens)
    for i in range(npre, npre + n):
        compute = flops_per_pair * pairs / peak  # op_time_s's roofline max of the attention core
        memory = (kv_layer * cached + q_bytes) / bw
        x = compute if compute >= memory else memory
        x = x * layers + linear + collective + head
        if floor > 0.0 and floor > x:
            x = floor
        d = fixed + x
        if sampling >= 0.0:
            d = d + sampling
        pairs += dp
        cached += dc
        if varied:
            d = d * table[picks[k] | (picks[k + 1] << 8)]
        e = s + d
        ends[i] = e
        s = e + gap_s
        k += 2
    return ends
