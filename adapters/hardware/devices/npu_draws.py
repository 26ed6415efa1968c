"""A run's pass timeline: per-pass variance factors and end times, computed on arrays.

An NPU run (`npu_run`) prices its passes in chunks (32-4096 of them as it proceeds); each pass's
duration is its model cost times its own variance factor, and pass i+1 starts `gap_s` after pass
i ends. These are the chunk's whole-array steps, in numpy: ~10 C calls a chunk where a Python
loop took a few hundred bytecodes a pass (docs/decisions.md, 2026-11-26). The arithmetic is the
stepwise path's, element by element — IEEE products and a sequential running sum — so a pass
ends on the same float as it would if the passes were sent one by one (tests check bit equality).
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from bisect import bisect_left
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

from deepserve.adapters.hardware.calibration import DP_COMPUTE_CV

SIGMA = math.sqrt(math.log1p(DP_COMPUTE_CV**2))  # lognormal with mean 1 and CV DP_COMPUTE_CV
FACTOR_BITS = 16  # one factor per 16-bit little-endian pick


@functools.cache
def factor_table() -> NDArray[np.float64]:
    """The lognormal's quantiles at the midpoints of 2**16 equal-probability slices (one per
    16-bit draw), scaled so that their mean is exactly 1. Built once, on first use (~40 ms)."""
    n, normal, half = 1 << FACTOR_BITS, NormalDist(), SIGMA * SIGMA / 2
    q = [math.exp(SIGMA * normal.inv_cdf((i + 0.5) / n) - half) for i in range(n)]
    mean = math.fsum(q) / n
    table = np.array([x / mean for x in q], dtype=np.float64)
    table.flags.writeable = False
    return table


@functools.cache
def factor_list() -> list[float]:
    """`factor_table` as a list (what the compiled chunk loop, npu_loop, indexes)."""
    return factor_table().tolist()  # type: ignore[no-any-return]


def picks_raw(seed: int, k: int) -> bytes:
    """The bytes of k 16-bit picks from one 64-bit seed: SHAKE-128 of the seed's 8
    little-endian bytes — the same picks on every machine and Python (one C call; seeding a
    Mersenne Twister for it cost ~10 us a chunk). Pick j is bytes 2j, 2j+1, little-endian."""
    if not 0 <= seed < 1 << 64 or k < 0:
        raise ValueError(f"picks_raw: a 64-bit seed and k >= 0, got {seed}, {k}")
    return hashlib.shake_128(seed.to_bytes(8, "little")).digest(2 * k)


def factor_picks(seed: int, k: int) -> NDArray[np.uint16]:
    """k 16-bit picks from one 64-bit seed (`picks_raw`), as little-endian 16-bit integers."""
    return np.frombuffer(picks_raw(seed, k), dtype="<u2")


def factor_picks_raw(rng: random.Random, k: int) -> bytes:
    """The raw picks of k factors (`variance_factors`' one draw of the caller's rng)."""
    return picks_raw(rng.getrandbits(64), k)


def factors_of(raw: bytes) -> NDArray[np.float64]:
    """The factors of raw picks (`factor_picks_raw`)."""
    return factor_table()[np.frombuffer(raw, dtype="<u2")]


def variance_factors(rng: random.Random, k: int) -> NDArray[np.float64]:
    """k independent duration factors, each lognormal with mean 1 and coefficient of variation
    DP_COMPUTE_CV (calibration.py: a DP group's compute variation between two barriers) — the
    distribution a single forward draws (`npu.variance_factor`), as a table of its 2**16
    equal-probability quantiles (its CV within 0.01 % of the calibrated one; the tails end at
    the quantiles 1/2**17 and 1 - 1/2**17, 4.3 sigma). One 64-bit draw of the caller's seeded
    rng (`ctx.rng`) a chunk: same seed, same factors."""
    if k <= 0:
        return np.empty(0, dtype=np.float64)
    return factor_table()[factor_picks(rng.getrandbits(64), k)]


def run_ends(
    gap_s: float, start_s: float, costs_s: Sequence[float] | NDArray[np.float64],
    factors: NDArray[np.float64] | Sequence[float] | None,
) -> tuple[float, ...]:  # fmt: skip
    """When each of consecutive passes ends: pass i+1 starts `gap_s` after pass i ends. The
    stepwise arithmetic (end = start + duration x factor; next start = end + gap) as one running
    sum over [start, d0, gap, d1, gap, ...]; `np.add.accumulate` adds left to right, one element
    at a time, so every end is the float the loop computes. No factors is variance off."""
    costs = np.asarray(costs_s, dtype=np.float64)
    k = len(costs)
    if k == 0:
        return ()
    seq: NDArray[np.float64] = np.empty(2 * k, dtype=np.float64)
    seq[0] = start_s
    if factors is None:
        seq[1::2] = costs
    else:
        np.multiply(costs, factors, out=seq[1::2])
    seq[2::2] = gap_s
    ends = np.add.accumulate(seq)[1::2]
    return tuple(ends.tolist())


def pass_starts(start_s: float, ends_s: tuple[float, ...], gap_s: float) -> tuple[float, ...]:
    """When each pass started: the same floats run_ends computed (next start = end + gap)."""
    return (start_s, *[e + gap_s for e in ends_s[:-1]]) if ends_s else ()


def truncation_point(ends_s: tuple[float, ...], now: float) -> int:
    """How many passes a run keeps when truncated at `now`: up to the first pass ending at or
    after `now` (the one running, or the one about to start after a gap). Ends ascend."""
    i = bisect_left(ends_s, now)
    return i + 1 if i < len(ends_s) else len(ends_s)
