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
leave equal states (swap-out memo included). Change both or neither.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import setitem
from typing import Any

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
    _pin_dram,
    _ref_dec,
    _ref_inc,
    _take_dram,
    _take_hbm,
    _unpin_dram,
)
from .state import (
    _UNMARKED,
    MASK,
    NONE,
    CopyOp,
    NamedCache,
    Node,
    Rtc,
    SeqBlocks,
    leave_lru,
    new_rtc,
)

SWAP_OUT = "swap_out"
POPULATE = "populate"
PREFETCH = "prefetch"


# ---- events ----------------------------------------------------------------------


def _seq(rtc: Rtc, seq: str) -> SeqBlocks:
    sb = rtc.seqs.get(seq)
    if sb is None:
        sb = rtc.seqs[seq] = SeqBlocks([])
    return sb


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


def _copy_started(rtc: Rtc, ev: RtcCopyStarted) -> None:
    rtc.copies[ev.copy_id] = CopyOp(ev.kind, ev.seq, list(ev.hashes), list(ev.hbm), list(ev.dram))
    rtc.next_copy += 1
    if ev.kind == SWAP_OUT:
        _swap_out_started(rtc, ev.hbm, ev.dram)
        return
    for d in ev.dram:
        _pin_dram(rtc, d)
    sb = _seq(rtc, ev.seq) if ev.seq is not None else None
    if sb is not None:
        for b in ev.shared:
            _ref_inc(rtc, b)
            sb.blocks.append(b)
    for b in ev.hbm:
        _take_hbm(rtc, b)  # the copy's reference
    if sb is not None:
        for b in ev.hbm:
            rtc.ref[b] += 1  # the sequence's reference
            sb.blocks.append(b)
        sb.loading += 1
        sb.num_cached = len(sb.blocks)


def _copy_finished(rtc: Rtc, ev: RtcCopyFinished) -> None:
    c = rtc.copies.pop(ev.copy_id)
    if len(ev.stored) != len(ev.parents):
        raise Diverged(f"copy {ev.copy_id}: {len(ev.stored)} hashes stored, {len(ev.parents)} parents")
    if c.kind == SWAP_OUT:
        _swap_out_finished(rtc, c, ev.stored if ev.ok else None)
    else:
        stored = dict(zip(ev.stored, ev.parents, strict=True))
        sb = rtc.seqs.get(c.seq) if c.seq is not None else None
        if sb is not None:
            sb.loading -= 1
        for h, b, d in zip(c.hashes, c.hbm, c.dram, strict=True):
            if ev.ok and h in stored:
                _index_hbm(rtc, h, stored[h], b)
            _unpin_dram(rtc, d)
        if not ev.ok and sb is not None:
            # The sequence keeps only the part of its prefix that was in HBM already.
            keep = len(sb.blocks) - len(c.hbm)
            for b in reversed(sb.blocks[keep:]):
                _ref_dec(rtc, b)
            del sb.blocks[keep:]
            sb.num_cached = keep
        for b in c.hbm:
            _ref_dec(rtc, b)
    rtc.finished[ev.copy_id] = ev.ok
    if len(rtc.finished) > rtc.config.max_copies_in_flight:
        rtc.finished.popitem(last=False)  # type: ignore[call-arg]


def _swap_out_started(rtc: Rtc, hbm: tuple[int, ...], dram: tuple[int, ...]) -> None:
    """The copy takes a reference on each HBM block (off the LRU: `_ref_inc`) and each DRAM
    destination (`_take_dram_each`), the common cases inline (a swap-out moves tens of blocks
    at once: one plain loop costs less than C-level maps' checks and calls)."""
    ref, lru, memo = rtc.ref, rtc.lru_hbm, rtc.swap_memo
    marks, gone, unsaved = memo.marks, memo.gone, memo.unsaved
    for b in hbm:
        r = ref[b]
        if r == 0:
            if b in lru:  # an unsaved block of `lru_hbm` (the blocks the plan picks)
                del lru[b]
            elif rtc.hbm_hash[b] is None:
                raise Diverged(f"HBM block {b} is free: it cannot be shared")
            else:
                leave_lru(rtc, b)
            if marks:  # _left_lru, inline
                i = marks.pop(b, _UNMARKED)
                if i >= 0:
                    gone[i] = 1
                    unsaved[i] = 0
                    memo.removed += 1
                elif i == -1:
                    memo.cold -= 1
        ref[b] = r + 1
    free, pins = rtc.free_dram, rtc.dram_pins
    k = min(len(dram), len(free))  # the free stack's top, popped in order (tiers._pick_dram)
    if k and free[len(free) - k :][::-1] == list(dram[:k]):
        del free[len(free) - k :]
        _each(setitem, repeat(pins), dram[:k], repeat(1))
        dram = dram[k:]
    if dram:
        _take_dram_each(rtc, dram)


def _take_dram_each(rtc: Rtc, dram: tuple[int, ...]) -> None:
    """`_take_dram` of each block, its two common cases inline: the free stack's top, and
    (once DRAM is full, every block of every swap-out) the eviction of an unpinned block."""
    dram_hash, free, pins, lru_dram = rtc.dram_hash, rtc.free_dram, rtc.dram_pins, rtc.lru_dram
    nodes, hbm_saved, memo = rtc.nodes, rtc.hbm_saved, rtc.swap_memo
    for d in dram:
        h = dram_hash[d]
        if h is None:
            if free and free[-1] == d:
                free.pop()
                pins[d] = 1
                continue
        elif pins[d] == 0 and d in lru_dram:
            del lru_dram[d]
            dram_hash[d] = None
            node = nodes[h]
            node.dram = NONE
            b = node.hbm
            if b == NONE:
                del nodes[h]
            else:
                hbm_saved[b] = 0
                if b in memo.marks:
                    memo.unsave(b)
            pins[d] = 1
            continue
        _take_dram(rtc, d)


def _swap_out_finished(rtc: Rtc, c: CopyOp, stored: tuple[int, ...] | None) -> None:
    """Index the DRAM copies that arrived (the hashes `stored`; None: the copy failed), unpin
    the DRAM blocks and drop the copy's HBM references (`_unpin_dram`, `_ref_dec`). Reversed,
    so that the blocks keep their order at the LRU front. The common case (every block
    arrived: `stored` is the copy's hashes, as `tiers.finish_copy` says so; each DRAM block
    pinned by this copy only, each HBM block held by it only) runs as C-level maps, in the
    same order as the loop would. (A block a copy holds keeps its content: only an
    unreferenced block is taken, so `hbm_hash[b]` is set.)"""
    n = len(c.hashes)
    if not n == len(c.hbm) == len(c.dram):
        raise Diverged(f"copy {c.hashes!r}: hashes, HBM and DRAM blocks differ in number")
    pins, ref = rtc.dram_pins, rtc.ref
    if (stored is not None and list(stored) == c.hashes
            and list(map(pins.__getitem__, c.dram)).count(1) == n
            and list(map(ref.__getitem__, c.hbm)).count(1) == n):  # fmt: skip
        nodes, dram_hash, hbm_saved = rtc.nodes, rtc.dram_hash, rtc.hbm_saved
        lru_dram, cold, marks = rtc.lru_dram, rtc.cold_hbm, rtc.swap_memo.marks
        for h, b, d in zip(reversed(c.hashes), reversed(c.hbm), reversed(c.dram), strict=True):
            nodes[h].dram = d
            dram_hash[d] = h
            hbm_saved[b] = 1
            pins[d] = 0
            ref[b] = 0
            lru_dram[d] = None
            # saved blocks released cold: the LRU's front, and the memo's known front, grow
            cold[b] = None
            marks[b] = -1
        memo = rtc.swap_memo
        memo.cold += n
        return
    _swap_out_finished_each(rtc, c, stored)


def _swap_out_finished_each(rtc: Rtc, c: CopyOp, stored: tuple[int, ...] | None) -> None:
    """`_swap_out_finished` block by block (a failed copy, a block shared meanwhile)."""
    arrived = set(stored) if stored is not None else None
    nodes, dram_hash, hbm_saved, hbm_hash = rtc.nodes, rtc.dram_hash, rtc.hbm_saved, rtc.hbm_hash
    pins, ref, lru_dram = rtc.dram_pins, rtc.ref, rtc.lru_dram
    cold = stored is not None
    for h, b, d in zip(reversed(c.hashes), reversed(c.hbm), reversed(c.dram), strict=True):
        if arrived is not None and h in arrived:
            nodes[h].dram = d
            dram_hash[d] = h
            hbm_saved[b] = 1
        if pins[d] == 1 and dram_hash[d] is not None:
            pins[d] = 0
            lru_dram[d] = None
        else:
            _unpin_dram(rtc, d)
        if cold and ref[b] == 1 and hbm_hash[b] is not None and hbm_saved[b]:
            # a saved block released cold: the LRU's front, and the memo's known front, grow
            ref[b] = 0
            rtc.cold_hbm[b] = None
            memo = rtc.swap_memo
            memo.marks[b] = -1
            memo.cold += 1
        else:
            _ref_dec(rtc, b, cold=cold)


def _each(fn: Callable[..., object], *args: Iterable[Any]) -> None:
    """fn(*items) for each zip of `args`, looped in C (no Python step a block). Pass builtins
    with a fast call (`operator.setitem`, bound methods of dict and list): a slot wrapper such
    as `ref.__setitem__` packs a tuple per call and costs more than the bytecode it saves."""
    deque(map(fn, *args), 0)


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


def _copy_started_reference(rtc: Rtc, ev: RtcCopyStarted) -> None:
    if ev.kind != SWAP_OUT:
        _copy_started(rtc, ev)  # populate and prefetch: written with the primitives already
        return
    rtc.copies[ev.copy_id] = CopyOp(ev.kind, ev.seq, list(ev.hashes), list(ev.hbm), list(ev.dram))
    rtc.next_copy += 1
    for b in ev.hbm:  # the copy reads each HBM block: a reference (off the LRU)
        _ref_inc(rtc, b)
    for d in ev.dram:  # and writes each DRAM block: reserved and pinned (evicting its KV)
        _take_dram(rtc, d)


def _copy_finished_reference(rtc: Rtc, ev: RtcCopyFinished) -> None:
    c = rtc.copies.get(ev.copy_id)
    if c is None or c.kind != SWAP_OUT:
        _copy_finished(rtc, ev)  # populate and prefetch: written with the primitives already
        return
    del rtc.copies[ev.copy_id]
    if len(ev.stored) != len(ev.parents):
        raise Diverged(f"copy {ev.copy_id}: {len(ev.stored)} hashes stored, {len(ev.parents)} parents")
    if not len(c.hashes) == len(c.hbm) == len(c.dram):
        raise Diverged(f"copy {c.hashes!r}: hashes, HBM and DRAM blocks differ in number")
    arrived = set(ev.stored) if ev.ok else set()
    # Reversed, so that the released blocks keep their order at the LRU's front.
    for h, b, d in zip(reversed(c.hashes), reversed(c.hbm), reversed(c.dram), strict=True):
        if h in arrived:  # DRAM holds this block's KV now: index it there
            rtc.nodes[h].dram = d
            rtc.dram_hash[d] = h
            rtc.hbm_saved[b] = 1
        _unpin_dram(rtc, d)
        _ref_dec(rtc, b, cold=ev.ok)  # saved: released cold, so it is evicted first
    rtc.finished[ev.copy_id] = ev.ok
    if len(rtc.finished) > rtc.config.max_copies_in_flight:
        rtc.finished.popitem(last=False)  # type: ignore[call-arg]


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
