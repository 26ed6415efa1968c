"""Aggregated decode runs on the NPU (`NpuForwardRun`): the simulation's fast path.

A run is `iterations` forward passes of one batch whose sequences each append their new tokens
after every pass, separated by the host's launch gap. Every pass's duration is the performance
model's for exactly that pass's shapes (the same `forward_cost_s` a single NpuForward gets) times
its own variance draw, so a run is the same timeline as the passes sent one by one — in one
request, one answer and a few events instead of three messages and three events per pass.
"""

from __future__ import annotations

from collections.abc import Callable

from deepserve.actors.ports.npu import NpuForwardRun, SeqShape

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


def run_times(
    msg: NpuForwardRun,
    start_s: float,
    cost_s: Callable[[tuple[SeqShape, ...]], float],
    factor: Callable[[], float],
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(starts, ends) of every pass: pass i+1 starts `gap_s` after pass i ends. The arithmetic is
    the stepwise path's (end = start + duration; next start = end + gap)."""
    starts: list[float] = []
    ends: list[float] = []
    t = start_s
    for i in range(msg.iterations):
        duration = cost_s(pass_shapes(msg, i)) * factor()
        starts.append(t)
        end = t + duration
        ends.append(end)
        t = end + msg.gap_s
    return tuple(starts), tuple(ends)


def truncation_point(ends_s: tuple[float, ...], now: float) -> int:
    """How many passes a run keeps when truncated at `now`: up to the first pass ending at or
    after `now` (the one running, or the one about to start after a gap)."""
    for i, end in enumerate(ends_s):
        if end >= now:
            return i + 1
    return len(ends_s)
