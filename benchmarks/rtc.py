"""Per-call cost of the RTC master on the scheduler's hot path (match, allocate, cache, free).

`rtc_rows(scale)` returns benchmark rows for `deepserve bench sim` (or any table): each
operation's wall time per call (mean over the fastest of 8 rounds of n calls), decision plus `apply` (what a DP master pays per request
per step), beside a floor measured in the same run on the same data — the bare dict/list work
the operation cannot avoid (one dict lookup per block; one list pop/append per block).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from deepserve.actors.flowserve import rtc
from deepserve.benchmarks.table import Row

PROMPT_BLOCKS = 32  # a 4k-token prompt at 128-token blocks
SHARED_BLOCKS = 24  # of which a shared system prompt / conversation history
MASK = (1 << 64) - 1


def _chains(n: int) -> list[list[int]]:
    """n prompts: 8 families sharing their first SHARED_BLOCKS blocks, unique tails."""
    out = []
    for i in range(n):
        h, chain = 0, []
        for j in range(PROMPT_BLOCKS):
            key = (i % 8) if j < SHARED_BLOCKS else (i + 1) * 1_000_003 + j
            h = (h * 0x100000001B3 + key + 1) & MASK
            chain.append(h)
        out.append(chain)
    return out


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3


def rtc_rows(scale: float = 1.0) -> list[Row]:
    """Measure; `scale` multiplies the number of requests per round (default 512 x 8 rounds)."""
    n = max(8, int(512 * scale))
    rounds = 8
    chains = _chains(n)
    misses = [[h ^ 0x5A5A for h in c] for c in chains]
    r = rtc.new_rtc(rtc.RtcConfig(hbm_blocks=n * PROMPT_BLOCKS * 2, dram_blocks=0, block_tokens=128))
    best: dict[str, float] = {}  # the fastest round of each: the least disturbed by other load
    seqs = [f"r{i}" for i in range(n)]
    matches: list[rtc.Match] = []

    def match_all() -> None:
        matches.clear()
        for c in chains:
            matches.append(rtc.match_by_prefix(r, c))

    def miss_all() -> None:
        for c in misses:
            rtc.match_by_prefix(r, c)

    def allocate_all() -> None:
        for s, m in zip(seqs, matches, strict=True):
            rtc.apply(r, rtc.allocate(r, s, PROMPT_BLOCKS - len(m.hbm_blocks), shared=m.hbm_blocks))

    def cache_all() -> None:
        for s, c in zip(seqs, chains, strict=True):
            ev = rtc.cache_blocks(r, s, c)
            if ev is not None:
                rtc.apply(r, ev)

    def free_all() -> None:
        for s in seqs:
            rtc.apply(r, rtc.free(r, s))

    index = {h: i for c in chains for i, h in enumerate(c)}

    def floor_lookup() -> None:  # one dict lookup per block of every prompt, nothing built
        get = index.get
        for c in chains:
            for h in c:
                get(h)

    pool = list(range(PROMPT_BLOCKS * n))

    def floor_list() -> None:  # take and give back one block id per block of every prompt
        for _ in range(n):
            got = [pool.pop() for _ in range(PROMPT_BLOCKS)]
            pool.extend(got)

    for rnd in range(rounds + 1):  # round 0 warms the cache (first prompts miss) and is not counted
        times = {"match_hit": _timed(match_all), "match_miss": _timed(miss_all),
                 "allocate": _timed(allocate_all), "cache": _timed(cache_all),
                 "free": _timed(free_all), "floor_lookup": _timed(floor_lookup),
                 "floor_list": _timed(floor_list)}  # fmt: skip
        if rnd:
            for k, v in times.items():
                best[k] = min(best.get(k, v), v)
    per = {k: v / n for k, v in best.items()}
    if rtc.hbm_used_blocks(r) != 0 or r.seqs:
        raise RuntimeError("RTC benchmark leaked blocks")  # a benchmark of a broken pool is void
    b = f"{PROMPT_BLOCKS}-block prompt"
    lookups = f"{PROMPT_BLOCKS} dict lookups"
    lists = f"{PROMPT_BLOCKS} list pop+append"
    return [
        Row(f"rtc match_by_prefix, hit ({b})", per["match_hit"], "us/call", lookups, per["floor_lookup"]),
        Row(f"rtc match_by_prefix, miss ({b})", per["match_miss"], "us/call", lookups, per["floor_lookup"]),
        Row(f"rtc allocate+apply ({PROMPT_BLOCKS - SHARED_BLOCKS} new, {SHARED_BLOCKS} shared)",
            per["allocate"], "us/call", lists, per["floor_list"]),
        Row(f"rtc cache_blocks+apply ({b})", per["cache"], "us/call", lookups, per["floor_lookup"]),
        Row(f"rtc free+apply ({b})", per["free"], "us/call", lists, per["floor_list"]),
    ]


if __name__ == "__main__":  # python -m deepserve.benchmarks.rtc
    from deepserve.benchmarks.table import render

    print(render("RTC master, per call (decision + apply)", rtc_rows()))
