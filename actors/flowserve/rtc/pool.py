"""The block pool's primitive moves, shared by `apply`: taking an HBM block for a new holder
(evicting the cached KV it held), references, indexing, and the DRAM pool's reserve/pin/unpin.

Each re-checks the state it expects and raises `Diverged` otherwise. Only `apply` calls them.
"""

from __future__ import annotations

from .state import NONE, Node, Rtc, RtcError, SwapMemo, leave_lru


class Diverged(RtcError):
    """An event names blocks that the state does not have where the event says."""


# ---- HBM blocks ----------------------------------------------------------------


def _take_hbm(rtc: Rtc, b: int) -> None:
    """Block b leaves the free stack or the LRU (dropping its indexed content) for a new holder."""
    h = rtc.hbm_hash[b]
    if h is None:
        free = rtc.free_hbm
        if not free or free[-1] != b:
            raise Diverged(f"HBM block {b} is not next on the free stack")
        free.pop()
    else:
        if rtc.ref[b] != 0 or (b not in rtc.lru_hbm and b not in rtc.cold_hbm):
            raise Diverged(f"HBM block {b} is not an unreferenced cached block")
        leave_lru(rtc, b)
        _left_lru(rtc.swap_memo, b)
        rtc.hbm_hash[b] = None
        rtc.hbm_saved[b] = 0
        node = rtc.nodes[h]
        node.hbm = NONE
        if node.dram == NONE:
            del rtc.nodes[h]
    rtc.ref[b] = 1


def _left_lru(memo: SwapMemo, b: int) -> None:
    """Block b left the LRU (the swap-out memo's bookkeeping, state.SwapMemo)."""
    i = memo.marks.pop(b, None)
    if i is not None:
        if i < 0:
            memo.cold -= 1  # one of the saved blocks put at the front since the scan
        else:
            memo.gone[i] = 1
            memo.unsaved[i] = 0
            memo.removed += 1


def _ref_inc(rtc: Rtc, b: int) -> None:
    if rtc.ref[b] == 0:
        if rtc.hbm_hash[b] is None:
            raise Diverged(f"HBM block {b} is free: it cannot be shared")
        leave_lru(rtc, b)
        _left_lru(rtc.swap_memo, b)
    rtc.ref[b] += 1


def _ref_dec(rtc: Rtc, b: int, cold: bool = False) -> None:
    """Drop one reference; at zero an indexed block becomes most recently used (least, if
    `cold`: it is safe in DRAM, so evict it first) and an unindexed one becomes free."""
    r = rtc.ref[b] - 1
    if r < 0:
        raise Diverged(f"HBM block {b}: reference count would go negative (double free)")
    rtc.ref[b] = r
    if r == 0:
        if rtc.hbm_hash[b] is None:
            rtc.free_hbm.append(b)
        elif not cold:
            rtc.lru_hbm[b] = None
        else:
            rtc.cold_hbm[b] = None  # at the LRU's front (lru_order)
            memo = rtc.swap_memo
            if rtc.hbm_saved[b]:  # the memo's known front grows by one saved block
                memo.marks[b] = -1
                memo.cold += 1
            else:
                memo.forget()


def _index_hbm(rtc: Rtc, h: int, parent: int | None, b: int) -> None:
    node = rtc.nodes.get(h)
    if node is None:
        rtc.nodes[h] = Node(parent, b)
    elif node.hbm != NONE:
        raise Diverged(f"block {h:#x} is already in HBM block {node.hbm}")
    else:
        node.hbm = b
        rtc.hbm_saved[b] = node.dram != NONE
        if node.dram == NONE and b in rtc.swap_memo.marks:
            rtc.swap_memo.forget()
    rtc.hbm_hash[b] = h


# ---- DRAM blocks -----------------------------------------------------------------


def _take_dram(rtc: Rtc, d: int) -> None:
    """DRAM block d is reserved as a copy's destination (pinned), evicting what it held."""
    h = rtc.dram_hash[d]
    if h is None:
        free = rtc.free_dram
        if not free or free[-1] != d:
            raise Diverged(f"DRAM block {d} is not next on the free stack")
        free.pop()
    else:
        if rtc.dram_pins[d] != 0 or d not in rtc.lru_dram:
            raise Diverged(f"DRAM block {d} is pinned: it cannot be evicted")
        del rtc.lru_dram[d]
        rtc.dram_hash[d] = None
        node = rtc.nodes[h]
        node.dram = NONE
        if node.hbm == NONE:
            del rtc.nodes[h]
        else:
            rtc.hbm_saved[node.hbm] = 0
            if node.hbm in rtc.swap_memo.marks:
                rtc.swap_memo.unsave(node.hbm)
    rtc.dram_pins[d] = 1


def _pin_dram(rtc: Rtc, d: int) -> None:
    if rtc.dram_pins[d] == 0:
        if rtc.dram_hash[d] is None:
            raise Diverged(f"DRAM block {d} holds nothing to read")
        del rtc.lru_dram[d]
    rtc.dram_pins[d] += 1


def _unpin_dram(rtc: Rtc, d: int) -> None:
    p = rtc.dram_pins[d] - 1
    if p < 0:
        raise Diverged(f"DRAM block {d}: pin count would go negative")
    rtc.dram_pins[d] = p
    if p == 0:
        if rtc.dram_hash[d] is None:
            rtc.free_dram.append(d)
        else:
            rtc.lru_dram[d] = None
