"""The RTC master's reads and decisions (DeepServe Table 1), as pure functions of an `Rtc`.

Reads (`match_by_prefix`, `match_by_id`, `can_allocate`, ...) return values. Decisions
(`allocate`, `append_block`, `cache_blocks`, `free`, `populate`, `prefetch`, `copy_to_dram`,
`plan_swap_out`, `finish_copy`, `create_cache`, `delete_cache`, `clear`) never change the state:
they pick the blocks and return the event that says so; the caller records it
(`ctx.record(ev)`), and its `evolve` calls `apply.apply`. So decide twice without recording and
you get the same answer twice. A decision the state cannot honour raises `RtcError` (callers ask
`can_allocate` first, as in nano-vllm's `can_allocate`/`allocate` pairs).
"""

from __future__ import annotations

from itertools import islice

import msgspec

from .apply import POPULATE, PREFETCH, SWAP_OUT
from .events import (
    RtcBlocksAllocated,
    RtcBlocksCached,
    RtcCacheCreated,
    RtcCacheDeleted,
    RtcCleared,
    RtcCopyFinished,
    RtcCopyStarted,
    RtcFreed,
)
from .state import DRAM, HBM, NONE, Rtc, RtcError


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
    nodes = rtc.nodes
    n = len(block_hashes)
    i = 0
    hbm: list[int] = []
    while i < n:
        node = nodes.get(block_hashes[i])
        if node is None or node.hbm == NONE:
            break
        hbm.append(node.hbm)
        i += 1
    if i == n or rtc.config.dram_blocks == 0:
        return Match(tuple(hbm)) if hbm else NO_MATCH
    dram: list[int] = []
    while i < n:
        node = nodes.get(block_hashes[i])
        if node is None or node.dram == NONE:
            break
        dram.append(node.dram)
        i += 1
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
    avail = len(rtc.free_hbm) + len(rtc.lru_hbm)
    if shared:
        ref = rtc.ref
        avail -= sum(1 for b in shared if ref[b] == 0)  # sharing takes them off the LRU
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
    evicted: list[int] = []
    if k < n:
        hbm_hash = rtc.hbm_hash
        skipping = set(skip)
        for b in rtc.lru_hbm:
            if b in skipping:
                continue
            picked.append(b)
            evicted.append(hbm_hash[b])  # type: ignore[arg-type]
            if len(picked) == n:
                break
        if len(picked) < n:
            raise RtcError(f"out of HBM blocks: need {n}, {len(picked)} can be freed")
    return picked, evicted


def _pick_dram(rtc: Rtc, n: int) -> tuple[list[int], list[int]]:
    free = rtc.free_dram
    k = min(n, len(free))
    picked = free[len(free) - k :][::-1]
    evicted: list[int] = []
    if k < n:
        for d in islice(rtc.lru_dram, n - k):
            picked.append(d)
            evicted.append(rtc.dram_hash[d])  # type: ignore[arg-type]
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


def cache_blocks(rtc: Rtc, seq: str, block_hashes: tuple[int, ...] | list[int]) -> RtcBlocksCached | None:
    """Index `seq`'s newly full, computed blocks under their chain hashes (`block_hashes` is the
    whole chain of the sequence's full blocks so far). None when there is nothing new."""
    sb = rtc.seqs.get(seq)
    if sb is None:
        raise RtcError(f"unknown sequence {seq!r}")
    upto = min(len(block_hashes), len(sb.blocks))
    start = sb.num_cached
    if upto <= start:
        return None
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


# ---- decisions: tiers -----------------------------------------------------------------


def _copy_id(rtc: Rtc) -> str:
    if len(rtc.copies) >= rtc.config.max_copies_in_flight:
        raise RtcError(f"too many copies in flight (max_copies_in_flight={rtc.config.max_copies_in_flight})")
    return f"c{rtc.next_copy}"


def _parents(chain: tuple[int, ...] | list[int], start: int, stop: int) -> tuple[int | None, ...]:
    return tuple(chain[i - 1] if i else None for i in range(start, stop))


def populate(
    rtc: Rtc, seq: str | None, block_hashes: tuple[int, ...] | list[int], match: Match | None = None
) -> RtcCopyStarted | None:
    """Populate: bring the DRAM run of `block_hashes`' cached prefix into HBM. With `seq`, the
    sequence takes the whole prefix at once (HBM run shared, DRAM run loading); it may not
    allocate until the copy finishes. None when nothing is in DRAM. Check `can_allocate(
    len(m.dram_blocks), m.hbm_blocks)` first."""
    m = match if match is not None else match_by_prefix(rtc, block_hashes)
    if not m.dram_blocks:
        return None
    shared = m.hbm_blocks if seq is not None else ()
    if seq is not None:
        _check_seq_free(rtc, seq)
        if seq in rtc.seqs and rtc.seqs[seq].blocks:
            raise RtcError(f"sequence {seq!r} already has blocks: populate it before allocating")
    copy_id = _copy_id(rtc)
    start, stop = len(m.hbm_blocks), m.num_blocks
    # Never evict the HBM run of the very prefix being completed (for prefetch too).
    hbm, evicted = _pick_hbm(rtc, stop - start, m.hbm_blocks)
    return RtcCopyStarted(
        copy_id=copy_id, kind=POPULATE if seq is not None else PREFETCH, seq=seq,
        hashes=tuple(block_hashes[start:stop]), parents=_parents(block_hashes, start, stop),
        hbm=tuple(hbm), dram=m.dram_blocks, shared=shared, evicted_hbm=tuple(evicted),
    )


def prefetch(rtc: Rtc, block_hashes: tuple[int, ...] | list[int]) -> RtcCopyStarted | None:
    """Background prefetch DRAM -> HBM (no sequence holds the blocks; they land in the LRU)."""
    m = match_by_prefix(rtc, block_hashes)
    if not m.dram_blocks or not can_allocate(rtc, len(m.dram_blocks), m.hbm_blocks):
        return None
    return populate(rtc, None, block_hashes, m)


def copy_to_dram(rtc: Rtc, block_hashes: tuple[int, ...] | list[int]) -> RtcCopyStarted | None:
    """Copy: write HBM-resident indexed blocks to DRAM (those not there already; as many as DRAM
    can take, evicting its least recently used blocks). None when there is nothing to copy."""
    nodes = rtc.nodes
    seen: set[int] = set()
    todo: list[tuple[int, int, int | None]] = []
    for h in block_hashes:
        n = nodes.get(h)
        if n is not None and n.hbm != NONE and n.dram == NONE and h not in seen:
            seen.add(h)
            todo.append((h, n.hbm, n.parent))
    room = len(rtc.free_dram) + len(rtc.lru_dram)
    todo = todo[:room]
    if not todo:
        return None
    dram, evicted = _pick_dram(rtc, len(todo))
    return RtcCopyStarted(
        copy_id=_copy_id(rtc), kind=SWAP_OUT, hashes=tuple(t[0] for t in todo),
        parents=tuple(t[2] for t in todo), hbm=tuple(t[1] for t in todo), dram=tuple(dram),
        evicted_dram=tuple(evicted),
    )


def plan_swap_out(rtc: Rtc) -> RtcCopyStarted | None:
    """Background swap-out under pressure: when free HBM (never-cached blocks) is below the low
    watermark, the coldest cached blocks — the next to be evicted — are written to DRAM first,
    so eviction drops only their HBM copy. None when there is no pressure or nothing to save."""
    cfg = rtc.config
    if cfg.dram_blocks == 0 or len(rtc.free_hbm) >= cfg.swap_low_watermark * cfg.hbm_blocks:
        return None
    if len(rtc.copies) >= cfg.max_copies_in_flight:
        return None
    nodes, hbm_hash = rtc.nodes, rtc.hbm_hash
    # Bounded scan of the LRU front: a block already in DRAM costs a lookup, not a copy.
    scan = islice(rtc.lru_hbm, 4 * cfg.swap_batch_blocks)
    cold = [h for b in scan if nodes[h := hbm_hash[b]].dram == NONE]  # type: ignore[index]
    return copy_to_dram(rtc, cold[: cfg.swap_batch_blocks]) if cold else None


def finish_copy(rtc: Rtc, copy_id: str, ok: bool, reason: str = "") -> RtcCopyFinished:
    """The executor reports a copy done (or failed): index what arrived."""
    c = rtc.copies.get(copy_id)
    if c is None:
        raise RtcError(f"unknown copy {copy_id!r} (finished twice, or the RTC was cleared)")
    stored: list[int] = []
    parents: list[int | None] = []
    if ok:
        nodes = rtc.nodes
        swap = c.kind == SWAP_OUT
        for h in c.hashes:
            node = nodes[h]
            if (node.dram if swap else node.hbm) == NONE:
                stored.append(h)
                parents.append(node.parent)
    return RtcCopyFinished(copy_id=copy_id, ok=ok, medium=DRAM if c.kind == SWAP_OUT else HBM,
                           stored=tuple(stored), parents=tuple(parents), reason=reason)


# ---- decisions: the ID index ------------------------------------------------------------


def create_cache(rtc: Rtc, cache_id: str, seq: str, block_hashes: tuple[int, ...] | list[int]) -> RtcCacheCreated:
    """Name the computed prefix of `seq` (its first cached blocks, chain `block_hashes`) so that
    `match_by_id(cache_id)` finds it; the named cache holds its blocks until deleted."""
    if cache_id in rtc.caches:
        raise RtcError(f"context cache {cache_id!r} exists already")
    if len(rtc.caches) >= rtc.config.max_named_caches:
        raise RtcError(f"too many context caches (max_named_caches={rtc.config.max_named_caches})")
    sb = rtc.seqs.get(seq)
    if sb is None:
        raise RtcError(f"unknown sequence {seq!r}")
    n = min(len(block_hashes), sb.num_cached)
    return RtcCacheCreated(cache_id=cache_id, hashes=tuple(block_hashes[:n]), blocks=tuple(sb.blocks[:n]))


def delete_cache(rtc: Rtc, cache_id: str) -> RtcCacheDeleted:
    if cache_id not in rtc.caches:
        raise RtcError(f"unknown context cache {cache_id!r}")
    return RtcCacheDeleted(cache_id=cache_id)


def clear(rtc: Rtc, reason: str) -> RtcCleared:
    return RtcCleared(reason=reason)
