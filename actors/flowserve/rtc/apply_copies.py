"""The fold of the tier copies (populate, prefetch, swap-out) into an `Rtc`: what `apply` does
for `RtcCopyStarted` and `RtcCopyFinished`, split from apply.py by concept.

As in apply.py, two versions of the same fold live side by side: the fast paths (a swap-out's
start and end with the pool's primitives inlined: a swap-out moves tens of blocks at once), and
`_copy_started_reference` / `_copy_finished_reference` after them, block by block through the
primitives (pool.py); tests/actors/flowserve/test_rtc_stateful.py folds every event through
both (`apply`, `apply_reference`) and checks they leave equal states. Change both or neither.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import setitem
from typing import Any

from .events import RtcCopyFinished, RtcCopyStarted
from .pool import (
    Diverged,
    _index_hbm,
    _pin_dram,
    _ref_dec,
    _ref_inc,
    _take_dram,
    _take_hbm,
    _unpin_dram,
)
from .state import _UNMARKED, NONE, CopyOp, Rtc, SeqBlocks, leave_lru

SWAP_OUT = "swap_out"
POPULATE = "populate"
PREFETCH = "prefetch"


def _seq(rtc: Rtc, seq: str) -> SeqBlocks:
    sb = rtc.seqs.get(seq)
    if sb is None:
        sb = rtc.seqs[seq] = SeqBlocks([])
    return sb


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


# ---- the readable reference -----------------------------------------------------
# The copies' fold without its inlined fast paths (apply.py's reference section says the rest).


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
