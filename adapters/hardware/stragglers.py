"""Seeded randomness of MoE serving: barrier-latency stragglers, expert popularity, EPLB.

Everything takes an explicit seed or random.Random, so the same seed gives the same values
(replay needs it). The expected values these distributions average to are in moe.py.
"""

from __future__ import annotations

import heapq
import math
import random

from deepserve.adapters.hardware.calibration import BARRIER_JITTER_SIGMA

# xDeepServe §7.1: a barrier's maximum latency "can be up to 10x" its minimum.
MAX_OVER_MIN = 10.0
# Lognormal sigma of expert popularity: gives ~20 % of experts above average and a hottest
# expert ~30x the average over 256 experts, as xDeepServe Fig. 11a reports. Fitted to Fig. 11a.
POPULARITY_SIGMA = 1.7


def _rng(seed: int | random.Random) -> random.Random:
    return seed if isinstance(seed, random.Random) else random.Random(seed)


def sample_barrier_latencies_s(
    base_s: float,
    mean_wait_s: float,
    n: int,
    seed: int | random.Random,
    *,
    sigma: float = BARRIER_JITTER_SIGMA,
    max_over_min: float = MAX_OVER_MIN,
) -> tuple[float, ...]:
    """n occurrences of a barrier (dispatch or combine): its own cost plus waiting for the
    slowest participant. The wait is lognormal with mean mean_wait_s (heavy right tail: a GC
    pause or a hot expert now and then), capped so no occurrence exceeds max_over_min x base."""
    if base_s <= 0 or mean_wait_s < 0 or n < 0:
        raise ValueError(
            f"need base_s > 0, mean_wait_s >= 0, n >= 0; got {base_s}, {mean_wait_s}, {n}"
        )
    rng = _rng(seed)
    mu = -sigma * sigma / 2  # E[lognormal(mu, sigma)] = 1
    cap = base_s * max_over_min
    return tuple(min(cap, base_s + mean_wait_s * rng.lognormvariate(mu, sigma)) for _ in range(n))


def sample_expert_popularity(
    n_experts: int, seed: int | random.Random, *, sigma: float = POPULARITY_SIGMA
) -> tuple[float, ...]:
    """Share of routing picks each expert gets (sums to 1), skewed like xDeepServe Fig. 11a."""
    if n_experts < 1:
        raise ValueError(f"n_experts: must be >= 1, got {n_experts}")
    rng = _rng(seed)
    weights = [rng.lognormvariate(0.0, sigma) for _ in range(n_experts)]
    total = sum(weights)
    return tuple(w / total for w in weights)


def expert_loads(tokens: int, popularity: tuple[float, ...], top_k: int) -> tuple[float, ...]:
    """Expected tokens per expert when each token picks top_k distinct experts."""
    if tokens < 0 or top_k < 1:
        raise ValueError(f"need tokens >= 0 and top_k >= 1; got {tokens}, {top_k}")
    return tuple(tokens * min(1.0, top_k * p) for p in popularity)


def eplb_placement(
    loads: tuple[float, ...], n_ranks: int, slots_per_rank: int
) -> tuple[tuple[int, ...], ...]:
    """Expert Placement Load Balancing (xDeepServe §4.5, step 2): spend the redundant slots on
    the expert whose per-replica load is highest, then place replicas heaviest-first on the
    least-loaded rank with a free slot. Returns the experts hosted by each rank."""
    slots = n_ranks * slots_per_rank
    if slots < len(loads):
        raise ValueError(
            f"slots_per_rank: {n_ranks} x {slots_per_rank} slots < {len(loads)} experts"
        )
    replicas = [1] * len(loads)
    heap = [(-load, e) for e, load in enumerate(loads)]
    heapq.heapify(heap)
    for _ in range(slots - len(loads)):
        _, e = heapq.heappop(heap)
        replicas[e] += 1
        heapq.heappush(heap, (-loads[e] / replicas[e], e))
    pieces = sorted(
        ((loads[e] / replicas[e], e) for e in range(len(loads)) for _ in range(replicas[e])),
        reverse=True,
    )
    ranks: list[list[int]] = [[] for _ in range(n_ranks)]
    rank_heap = [(0.0, r) for r in range(n_ranks)]
    for load, e in pieces:
        total, r = heapq.heappop(rank_heap)
        ranks[r].append(e)
        if len(ranks[r]) < slots_per_rank:
            heapq.heappush(rank_heap, (total + load, r))
    return tuple(tuple(r) for r in ranks)


def rank_loads(
    loads: tuple[float, ...], placement: tuple[tuple[int, ...], ...]
) -> tuple[float, ...]:
    """Tokens per rank when an expert's tokens are split evenly over its replicas (§4.5 step 4)."""
    replicas = [0] * len(loads)
    for rank in placement:
        for e in rank:
            replicas[e] += 1
    if any(r == 0 for r in replicas):
        raise ValueError("placement: every expert needs at least one replica")
    return tuple(sum(loads[e] / replicas[e] for e in rank) for rank in placement)


def hot_ratio(values: tuple[float, ...]) -> float:
    """Hottest / mean: how much longer the slowest participant takes than the average one."""
    mean = math.fsum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0
