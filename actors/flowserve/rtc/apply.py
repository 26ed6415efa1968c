"""`apply(rtc, event)`: the ONLY code that changes an `Rtc`.

The owner's `evolve` calls it for every RTC event, in place: `ctx.record(event)` is therefore
the one way the block pool, the ref counts, the index and the tiers change, and replaying the
recorded events rebuilds the state exactly (no copying on the hot path). The events carry the
block ids the decision functions picked; `apply` re-checks them against the state (a mismatch
means a log and a state that diverged, and raises instead of corrupting the pool).

Two versions of the same fold live here. `apply` is the one every caller uses: its per-block
loops (allocation, indexing, release, a swap-out's start and end) have the pool's primitives
(`pool.py`) inlined, because they run tens of times per request. `apply_reference`, at the end,
says the same thing block by block through those primitives; it is what to read first, and
tests/actors/flowserve/test_rtc_stateful.py folds every event through both and checks that they
leave equal states (swap-out memo included). Change both or neither. The tier copies' part of
both (populate, prefetch, swap-out) is in apply_copies.py, the same way.
"""

from __future__ import annotations

from .apply_copies import (  # noqa: F401 (re-exported: tiers, executor, the package)
    POPULATE,
    PREFETCH,
    SWAP_OUT,
    _copy_finished,
    _copy_finished_reference,
    _copy_started,
    _copy_started_reference,
    _seq,
)
from .events import (
    RtcBlocksAllocated,
    RtcBlocksCached,
    RtcBlocksMasked,
    RtcCacheCreated,
    RtcCacheDeleted,
    RtcCleared,
    RtcCopyFinished,
    RtcCopyStarted,
    RtcFreed,
)
from .pool import (
    Diverged,
    _index_hbm,
    _left_lru,
    _ref_dec,
    _ref_inc,
    _take_hbm,
)
from .state import (
    _UNMARKED,
    MASK,
    NONE,
    NamedCache,
    Node,
    Rtc,
    leave_lru,
    new_rtc,
)

# ---- events ----------------------------------------------------------------------


def _allocated(rtc: Rtc, ev: RtcBlocksAllocated) -> None:
    sb = _seq(rtc, ev.seq)
    table = sb.blocks
    if ev.shared:
        # _ref_inc inlined: a prefix hit shares tens of blocks per request
        ref, lru, memo = rtc.ref, rtc.lru_hbm, rtc.swap_memo
        for b in ev.shared:
            r = ref[b]
            if r == 0:
                if rtc.hbm_hash[b] is None:
                    raise Diverged(f"HBM block {b} is free: it cannot be shared")
                if b in lru:
                    del lru[b]
                else:
                    del rtc.cold_hbm[b]
                if b in memo.marks:
                    _left_lru(memo, b)
            ref[b] = r + 1
        table.extend(ev.shared)
        sb.num_cached = len(table)
    free, hbm_hash, ref, lru, cold = rtc.free_hbm, rtc.hbm_hash, rtc.ref, rtc.lru_hbm, rtc.cold_hbm
    nodes, memo = rtc.nodes, rtc.swap_memo
    marks, gone, unsaved = memo.marks, memo.gone, memo.unsaved
    for b in ev.blocks:  # _take_hbm's two common cases, inlined
        h = hbm_hash[b]
        if h is None and free and free[-1] == b:
            free.pop()
            ref[b] = 1
        # evict a cached block (leave_lru: the LRU dicts' values are None, their default 0)
        elif h is not None and ref[b] == 0 and (cold.pop(b, 0) is None or lru.pop(b, 0) is None):
            if marks:  # _left_lru, inline
                i = marks.pop(b, _UNMARKED)
                if i >= 0:
                    gone[i] = 1
                    unsaved[i] = 0
                    memo.removed += 1
                elif i == -1:
                    memo.cold -= 1
            hbm_hash[b] = None
            rtc.hbm_saved[b] = 0
            node = nodes[h]
            node.hbm = NONE
            if node.dram == NONE:
                del nodes[h]
            ref[b] = 1
        else:
            _take_hbm(rtc, b)
    table.extend(ev.blocks)


def _cached(rtc: Rtc, ev: RtcBlocksCached) -> None:
    sb = rtc.seqs[ev.seq]
    nodes, hbm_hash = rtc.nodes, rtc.hbm_hash
    for b, h, p in zip(ev.blocks, ev.hashes, ev.parents, strict=True):
        if h in nodes:
            _index_hbm(rtc, h, p, b)
        else:  # _index_hbm's common case: a block seen for the first time
            nodes[h] = Node(p, b)
            hbm_hash[b] = h
    sb.num_cached = ev.num_cached


def _freed(rtc: Rtc, ev: RtcFreed) -> None:
    sb = rtc.seqs.pop(ev.seq)
    if sb.loading:
        # Its populate copies still hold their own references; they no longer fill a table (a
        # later sequence with the same id must not be touched when they end).
        for c in rtc.copies.values():
            if c.seq == ev.seq:
                c.seq = None
    ref, hbm_hash, lru, free = rtc.ref, rtc.hbm_hash, rtc.lru_hbm, rtc.free_hbm
    # Tail blocks first: they are the least likely to be shared, so they are evicted first.
    # (_ref_dec inlined: a request frees all its blocks at once.)
    for b in reversed(sb.blocks):
        r = ref[b] - 1
        if r < 0:
            raise Diverged(f"HBM block {b}: reference count would go negative (double free)")
        ref[b] = r
        if r == 0:
            if hbm_hash[b] is None:
                free.append(b)
            else:
                lru[b] = None


def _cache_created(rtc: Rtc, ev: RtcCacheCreated) -> None:
    for b in ev.blocks:
        _ref_inc(rtc, b)
    rtc.caches[ev.cache_id] = NamedCache(list(ev.hashes), list(ev.blocks))


def _cache_deleted(rtc: Rtc, ev: RtcCacheDeleted) -> None:
    for b in reversed(rtc.caches.pop(ev.cache_id).blocks):
        _ref_dec(rtc, b)


def _cleared(rtc: Rtc, ev: RtcCleared) -> None:
    fresh = new_rtc(rtc.config)
    for name in rtc.__struct_fields__:
        if name not in ("config", "next_copy"):
            setattr(rtc, name, getattr(fresh, name))
    rtc.swap_memo = fresh.swap_memo  # not a field: what it knew was of the pool just dropped


def _masked(rtc: Rtc, ev: RtcBlocksMasked) -> None:
    """Each block leaves the free stack (anywhere in it) or the LRU, for the mask's holding."""
    mask = rtc.caches.get(MASK)
    if mask is None:
        mask = rtc.caches[MASK] = NamedCache([], [])
    for b in ev.blocks:
        if rtc.ref[b] != 0:
            raise Diverged(f"HBM block {b} is referenced: it cannot be masked")
        if rtc.hbm_hash[b] is None:
            try:
                rtc.free_hbm.remove(b)
            except ValueError:
                raise Diverged(f"HBM block {b} is neither free nor cached") from None
        else:
            h = rtc.hbm_hash[b]
            leave_lru(rtc, b)
            _left_lru(rtc.swap_memo, b)
            rtc.hbm_hash[b] = None
            rtc.hbm_saved[b] = 0
            node = rtc.nodes[h]  # type: ignore[index]
            node.hbm = NONE
            if node.dram == NONE:
                del rtc.nodes[h]  # type: ignore[arg-type]
        rtc.ref[b] = 1
        mask.blocks.append(b)


_APPLY = {
    RtcBlocksMasked: _masked,
    RtcBlocksAllocated: _allocated,
    RtcBlocksCached: _cached,
    RtcFreed: _freed,
    RtcCopyStarted: _copy_started,
    RtcCopyFinished: _copy_finished,
    RtcCacheCreated: _cache_created,
    RtcCacheDeleted: _cache_deleted,
    RtcCleared: _cleared,
}


def apply(rtc: Rtc, event: object) -> Rtc:
    """Fold one RTC event into `rtc` in place and return it (so `evolve` can return it)."""
    _APPLY[type(event)](rtc, event)  # type: ignore[index, operator]
    return rtc


def is_rtc_event(event: object) -> bool:
    return type(event) in _APPLY


# ---- the readable reference -----------------------------------------------------
# `apply` without its inlined fast paths: each block moves through one pool primitive. Not
# called on any hot path; the state-machine test holds `apply` to it event by event.


def _allocated_reference(rtc: Rtc, ev: RtcBlocksAllocated) -> None:
    table = _seq(rtc, ev.seq).blocks
    for b in ev.shared:  # a prefix hit: one more reference on each shared block
        _ref_inc(rtc, b)
    table.extend(ev.shared)
    if ev.shared:
        rtc.seqs[ev.seq].num_cached = len(table)
    for b in ev.blocks:  # fresh blocks: the free stack's top, else an evicted cached block
        _take_hbm(rtc, b)
    table.extend(ev.blocks)


def _cached_reference(rtc: Rtc, ev: RtcBlocksCached) -> None:
    for b, h, p in zip(ev.blocks, ev.hashes, ev.parents, strict=True):
        _index_hbm(rtc, h, p, b)
    rtc.seqs[ev.seq].num_cached = ev.num_cached


def _freed_reference(rtc: Rtc, ev: RtcFreed) -> None:
    sb = rtc.seqs.pop(ev.seq)
    for c in rtc.copies.values():  # its populate copies no longer fill a table
        if c.seq == ev.seq:
            c.seq = None
    for b in reversed(sb.blocks):  # tail first: the least likely to be shared, evicted first
        _ref_dec(rtc, b)


_APPLY_REFERENCE = {
    **_APPLY,
    RtcBlocksAllocated: _allocated_reference,
    RtcBlocksCached: _cached_reference,
    RtcFreed: _freed_reference,
    RtcCopyStarted: _copy_started_reference,
    RtcCopyFinished: _copy_finished_reference,
}


def apply_reference(rtc: Rtc, event: object) -> Rtc:
    """`apply`, block by block through the pool's primitives (the module's docstring)."""
    _APPLY_REFERENCE[type(event)](rtc, event)  # type: ignore[index, operator]
    return rtc
