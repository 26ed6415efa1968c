"""The RTC master's reads and decisions (DeepServe Table 1), as pure functions of an `Rtc`.

Reads (`match_by_prefix`, `match_by_id`, `can_allocate`, ...) return values. Decisions
(`allocate`, `append_block`, `cache_blocks`, `free`, `create_cache`, `delete_cache`, `clear`;
the tier decisions are in `tiers`) never change the state:
they pick the blocks and return the event that says so; the caller records it
(`ctx.record(ev)`), and its `evolve` calls `apply.apply`. So decide twice without recording and
you get the same answer twice. A decision the state cannot honour raises `RtcError` (callers ask
`can_allocate` first, as in nano-vllm's `can_allocate`/`allocate` pairs).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import filterfalse, islice

import msgspec

from .events import (
    RtcBlocksAllocated,
    RtcBlocksCached,
    RtcBlocksMasked,
    RtcCacheCreated,
    RtcCacheDeleted,
    RtcCleared,
    RtcFreed,
)
from .state import MASK, NONE, Rtc, RtcError, SeqBlocks, lru_blocks, lru_order


class Match(msgspec.Struct, frozen=True, gc=False):
    """The cached part of a prompt's prefix: first a run of blocks resident in HBM (usable at
    once: pass them as `shared` to `allocate`), then a run in DRAM (`Populate` brings them in)."""

    hbm_blocks: tuple[int, ...] = ()
    dram_blocks: tuple[int, ...] = ()

    @property
    def num_blocks(self) -> int:
        return len(self.hbm_blocks) + len(self.dram_blocks)


NO_MATCH = Match()


# ---- reads ------------------------------------------------------------------------


def match_by_prefix(rtc: Rtc, block_hashes: tuple[int, ...] | list[int]) -> Match:
    """MatchByPrefixToken: the longest cached prefix of `block_hashes` (chain hashes of full
    blocks). One dict lookup per matched block; nothing is copied on a miss."""
    get = rtc.nodes.get
    hbm: list[int] = []
    append = hbm.append
    for h in block_hashes:  # plain iteration and bound methods: this runs per request per step
        node = get(h)
        if node is None:
            break
        b = node.hbm
        if b < 0:
            break
        append(b)
    i = len(hbm)
    if i == len(block_hashes) or rtc.config.dram_blocks == 0:
        return Match(tuple(hbm)) if hbm else NO_MATCH
    dram: list[int] = []
    for h in block_hashes[i:]:
        node = get(h)
        if node is None or node.dram < 0:
            break
        dram.append(node.dram)
    if not hbm and not dram:
        return NO_MATCH
    return Match(tuple(hbm), tuple(dram))


def match_by_id(rtc: Rtc, cache_id: str) -> tuple[tuple[int, ...], Match] | None:
    """MatchByID: a named cache's chain hashes and blocks (always in HBM: the cache holds them)."""
    entry = rtc.caches.get(cache_id)
    if entry is None:
        return None
    return tuple(entry.hashes), Match(tuple(entry.blocks))


def block_table(rtc: Rtc, seq: str) -> list[int]:
    """The HBM block ids of `seq` in token order (read-only view: do not mutate)."""
    sb = rtc.seqs.get(seq)
    return sb.blocks if sb is not None else []


def can_allocate(rtc: Rtc, num_blocks: int, shared: tuple[int, ...] = ()) -> bool:
    """Whether `allocate(seq, num_blocks, shared)` would succeed now."""
    avail = len(rtc.free_hbm) + lru_blocks(rtc)
    if shared:
        avail -= list(map(rtc.ref.__getitem__, shared)).count(0)  # sharing takes them off the LRU
    return avail >= num_blocks


def is_loading(rtc: Rtc, seq: str) -> bool:
    sb = rtc.seqs.get(seq)
    return sb is not None and sb.loading > 0


def copy_status(rtc: Rtc, copy_id: str) -> str:
    """QueryPopulate: "pending", "done", "failed", or "unknown" (never started, or forgotten)."""
    if copy_id in rtc.copies:
        return "pending"
    ok = rtc.finished.get(copy_id)
    return "unknown" if ok is None else ("done" if ok else "failed")


# ---- block picking ----------------------------------------------------------------


def _pick_hbm(rtc: Rtc, n: int, skip: tuple[int, ...] = ()) -> tuple[list[int], list[int]]:
    """The n blocks an allocation takes, in the order `apply` takes them (free stack top first,
    then the LRU front), and the chain hashes evicted with them."""
    free = rtc.free_hbm
    k = min(n, len(free))
    picked = free[len(free) - k :][::-1]
    if k < n:
        # the LRU's front, past `skip` (a prefix hit's blocks, shared first): islice in C
        order = lru_order(rtc)
        if skip:
            order = filterfalse(set(skip).__contains__, order)
        picked += islice(order, n - k)
        if len(picked) < n:
            raise RtcError(f"out of HBM blocks: need {n}, {len(picked)} can be freed")
        evicted: list[int] = list(map(rtc.hbm_hash.__getitem__, picked[k:]))  # type: ignore[arg-type]
    else:
        evicted = []
    return picked, evicted


def _check_seq_free(rtc: Rtc, seq: str) -> None:
    sb = rtc.seqs.get(seq)
    if sb is None:
        if len(rtc.seqs) >= rtc.config.max_seqs:
            raise RtcError(f"too many sequences hold blocks (max_seqs={rtc.config.max_seqs})")
    elif sb.loading:
        raise RtcError(f"sequence {seq!r} is being populated: wait for its copy to finish")


# ---- decisions: blocks ------------------------------------------------------------


def allocate(rtc: Rtc, seq: str, num_blocks: int, shared: tuple[int, ...] = ()) -> RtcBlocksAllocated:
    """AllocBlocks: `num_blocks` fresh blocks for `seq`, after reusing `shared` (a prefix hit,
    `Match.hbm_blocks`; only on a sequence's first allocation)."""
    if num_blocks < 0:
        raise RtcError(f"num_blocks must be >= 0, got {num_blocks}")
    _check_seq_free(rtc, seq)
    if shared and seq in rtc.seqs and rtc.seqs[seq].blocks:
        raise RtcError(f"sequence {seq!r} already has blocks: a prefix can only be shared first")
    picked, evicted = _pick_hbm(rtc, num_blocks, shared)
    return RtcBlocksAllocated(seq=seq, shared=shared, blocks=tuple(picked), evicted=tuple(evicted))


def append_block(rtc: Rtc, seq: str) -> RtcBlocksAllocated:
    """AppendBlock: one more block for a decoding sequence."""
    if seq not in rtc.seqs:
        raise RtcError(f"unknown sequence {seq!r}: AllocBlocks first")
    return allocate(rtc, seq, 1)


def cache_blocks(
    rtc: Rtc, seq: str, block_hashes: tuple[int, ...] | list[int], num_blocks: int | None = None
) -> RtcBlocksCached | None:
    """Index `seq`'s newly full, computed blocks under their chain hashes (`block_hashes`: the
    sequence's chain; only its first `num_blocks` — default all — are computed). None when
    there is nothing new (the common case: one comparison, no copy of the chain)."""
    sb = rtc.seqs.get(seq)
    if sb is None:
        raise RtcError(f"unknown sequence {seq!r}")
    upto = min(len(block_hashes), len(sb.blocks))
    if num_blocks is not None:
        upto = min(upto, num_blocks)
    start = sb.num_cached
    if upto <= start:
        return None
    hashes = tuple(block_hashes[start:upto])
    if not any(map(rtc.nodes.__contains__, hashes)):  # the common case: all new, in C
        return RtcBlocksCached(
            seq=seq, num_cached=upto, blocks=tuple(sb.blocks[start:upto]), hashes=hashes,
            parents=(block_hashes[start - 1] if start else None, *hashes[:-1]),
        )  # fmt: skip
    return _cache_some(rtc, seq, sb, block_hashes, start, upto)


def _cache_some(
    rtc: Rtc, seq: str, sb: SeqBlocks, block_hashes: tuple[int, ...] | list[int], start: int, upto: int
) -> RtcBlocksCached:
    """`cache_blocks` block by block, when some of the blocks' hashes are indexed already."""
    nodes = rtc.nodes
    blocks: list[int] = []
    hashes: list[int] = []
    parents: list[int | None] = []
    table = sb.blocks
    for i in range(start, upto):
        h = block_hashes[i]
        node = nodes.get(h)
        if node is not None and node.hbm != NONE:
            continue  # computed twice (concurrent prefills): keep the indexed copy
        blocks.append(table[i])
        hashes.append(h)
        parents.append(block_hashes[i - 1] if i else None)
    return RtcBlocksCached(
        seq=seq, num_cached=upto, blocks=tuple(blocks), hashes=tuple(hashes), parents=tuple(parents)
    )


def free(rtc: Rtc, seq: str) -> RtcFreed:
    """Free: `seq` releases its blocks; indexed ones stay cached until evicted."""
    if seq not in rtc.seqs:
        raise RtcError(f"unknown sequence {seq!r} (freed twice?)")
    return RtcFreed(seq=seq)


# ---- decisions: the ID index ------------------------------------------------------------


def create_cache(rtc: Rtc, cache_id: str, seq: str, block_hashes: tuple[int, ...] | list[int]) -> RtcCacheCreated:
    """Name the computed prefix of `seq` (its first cached blocks, chain `block_hashes`) so that
    `match_by_id(cache_id)` finds it; the named cache holds its blocks until deleted."""
    if cache_id in rtc.caches or cache_id == MASK:
        raise RtcError(f"context cache {cache_id!r} exists already")
    if len(rtc.caches) >= rtc.config.max_named_caches:
        raise RtcError(f"too many context caches (max_named_caches={rtc.config.max_named_caches})")
    sb = rtc.seqs.get(seq)
    if sb is None:
        raise RtcError(f"unknown sequence {seq!r}")
    if sb.loading:
        raise RtcError(f"sequence {seq!r} is being populated: name it after its copy finishes")
    n = min(len(block_hashes), sb.num_cached)
    return RtcCacheCreated(cache_id=cache_id, hashes=tuple(block_hashes[:n]), blocks=tuple(sb.blocks[:n]))


def delete_cache(rtc: Rtc, cache_id: str) -> RtcCacheDeleted:
    if cache_id not in rtc.caches or cache_id == MASK:
        raise RtcError(f"unknown context cache {cache_id!r}")
    return RtcCacheDeleted(cache_id=cache_id)


def mask_blocks(rtc: Rtc, blocks: Iterable[int], reason: str) -> tuple[RtcBlocksMasked | None, tuple[int, ...]]:
    """HBM fault masking: the event taking the unreferenced ones of `blocks` out of the pool
    (None: none is), and the blocks still referenced (by named caches or copies in flight:
    the caller ends their holders, or leaves them), in block order. Sequences holding any of
    `blocks` are the caller's to end first."""
    ref, hashes, masked = rtc.ref, rtc.hbm_hash, rtc.caches.get(MASK)
    done = set(masked.blocks) if masked is not None else set()
    free, held, evicted = [], [], []
    for b in sorted(set(blocks) - done):
        if ref[b]:
            held.append(b)
            continue
        free.append(b)
        h = hashes[b]
        if h is not None:
            evicted.append(h)
    ev = RtcBlocksMasked(blocks=tuple(free), evicted=tuple(evicted), reason=reason) if free else None
    return ev, tuple(held)


def clear(rtc: Rtc, reason: str) -> RtcCleared:
    return RtcCleared(reason=reason)
