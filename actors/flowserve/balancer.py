"""DP load balancing across a TE's DP groups (xDeepServe §4.3) — pure policies.

- Prefill (and colocated chat): single-level collaborative scheduling. The leader has every
  group's status and, for each pending request, how many of its prompt blocks each group holds in
  HBM (the all-gather); it assigns requests one by one to the group whose queue of prompt tokens
  still to compute, plus this request's uncached tokens, is smallest — so prefix-cache hits pull
  a request toward the group that has its prefix, and long prompts spread.
- Decode: exclude groups at their batch limit (running + already dispatched), then pick the
  lowest KV usage counting the space reserved for long outputs.
- Round-robin, the baseline.
- A group whose device is lost (`DpLoad.device_lost`) is picked by neither of the first two
  unless every group is lost (it refuses the request then, and its TE is failed over).

Each policy updates its local view as it assigns, so a burst spreads instead of piling onto the
group that looked best before the burst.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from deepserve.actors.flowserve.messages import DpLoad
from deepserve.actors.flowserve.tokens import blocks_needed

POLICIES = ("collaborative", "round_robin")


class Pending(msgspec.Struct, frozen=True):
    """A request to place: its prompt, its output-space reservation, and per-group prefix hits."""

    num_tokens: int
    reserve_tokens: int  # output tokens it may still produce (max_tokens or a known target)
    hit_blocks: tuple[int, ...]  # per group, in group order
    decode: bool = False


class _View:
    __slots__ = ("prefill_tokens", "seqs", "max_seqs", "used", "total", "lost")

    def __init__(self, load: DpLoad) -> None:
        self.prefill_tokens = load.prefill_tokens_waiting
        self.seqs = load.running + load.waiting
        self.max_seqs = load.max_num_seqs or 1 << 30
        self.used = load.kv_blocks_used + load.kv_blocks_reserved
        self.total = max(load.kv_blocks_total, 1)
        self.lost = bool(load.device_lost)  # chosen only when every group is lost


def assign(
    loads: Sequence[DpLoad], pending: Sequence[Pending], block_tokens: int, policy: str,
    rr_next: int = 0,
) -> list[int]:  # fmt: skip
    """The group index for each pending request, in order."""
    if not loads:
        raise ValueError("loads: a TE has at least one DP group")
    if policy not in POLICIES:
        raise ValueError(f"policy: unknown {policy!r}; known: {', '.join(POLICIES)}")
    n = len(loads)
    if policy == "round_robin":
        return [(rr_next + i) % n for i in range(len(pending))]
    views = [_View(ld) for ld in loads]
    out: list[int] = []
    for p in pending:
        g = _decode_pick(views, p, block_tokens) if p.decode else _prefill_pick(views, p, block_tokens)
        v = views[g]
        v.seqs += 1
        v.used += blocks_needed(p.num_tokens + p.reserve_tokens, block_tokens)
        if not p.decode:
            v.prefill_tokens += max(0, p.num_tokens - p.hit_blocks[g] * block_tokens)
        out.append(g)
    return out


def _prefill_pick(views: list[_View], p: Pending, block_tokens: int) -> int:
    def cost(g: int) -> tuple[bool, float, float, int]:
        v = views[g]
        uncached = max(0, p.num_tokens - p.hit_blocks[g] * block_tokens)
        return (v.lost, v.prefill_tokens + uncached, v.used / v.total, g)

    return min(range(len(views)), key=cost)


def _decode_pick(views: list[_View], p: Pending, block_tokens: int) -> int:
    live = [g for g, v in enumerate(views) if not v.lost] or list(range(len(views)))
    open_ = [g for g in live if views[g].seqs < views[g].max_seqs] or live
    return min(open_, key=lambda g: (views[g].used / views[g].total, g))


def balance_quality(loads: Sequence[DpLoad]) -> float:
    """max / mean KV usage across groups (1.0 = perfectly even); 1.0 when all are empty."""
    usage = [ld.kv_blocks_used / max(ld.kv_blocks_total, 1) for ld in loads]
    mean = sum(usage) / len(usage)
    return max(usage) / mean if mean > 0 else 1.0
