"""The RTC master's tier decisions: Populate (DRAM -> HBM for a sequence), background prefetch,
Copy (HBM -> DRAM), background swap-out of cold blocks under pressure, and the end of a copy.

Like `master`, pure: each returns the `RtcCopyStarted` / `RtcCopyFinished` event to record (or
None when there is nothing to do); the executor moves the bytes in between.
"""

from __future__ import annotations

from itertools import islice
from operator import attrgetter, itemgetter

from .apply import POPULATE, PREFETCH, SWAP_OUT
from .events import RtcCopyFinished, RtcCopyStarted
from .master import Match, _check_seq_free, _pick_hbm, can_allocate, match_by_prefix
from .state import DRAM, HBM, NONE, Rtc, RtcError, SwapMemo, lru_blocks, lru_order

_PARENT, _DRAM = attrgetter("parent"), attrgetter("dram")


def _pick_dram(rtc: Rtc, n: int) -> tuple[list[int], list[int]]:
    free = rtc.free_dram
    k = min(n, len(free))
    picked = free[len(free) - k :][::-1]
    if k == n:
        return picked, []
    lru = list(islice(rtc.lru_dram, n - k))
    picked += lru
    return picked, list(map(rtc.dram_hash.__getitem__, lru))  # type: ignore[arg-type]



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
    size = 4 * cfg.swap_batch_blocks
    memo = rtc.swap_memo
    if memo.known() < min(size, lru_blocks(rtc)):
        _scan(rtc, memo, SwapMemo.EXTENT * size)
    first, cold = memo.unsaved_within(size)
    if not cold:
        return None
    # Fewer than `swap_min_blocks` are not worth a copy of their own, unless the coldest of
    # them is among the next `swap_batch_blocks` blocks an allocation takes (free stack, LRU).
    if len(cold) < cfg.swap_min_blocks and len(rtc.free_hbm) + first >= cfg.swap_batch_blocks:
        return None
    return _swap_out(rtc, cold[: cfg.swap_batch_blocks])


def plan_swap_out_reference(rtc: Rtc) -> RtcCopyStarted | None:
    """`plan_swap_out`, readable: a walk of the LRU's front where the fast path asks the
    swap-out memo (state.SwapMemo), and `copy_to_dram` where it builds the event by maps
    (`_swap_out`). Never called on a hot path: tests/actors/flowserve/test_rtc_stateful.py
    asks both at every step of its runs. Change both."""
    cfg = rtc.config
    if cfg.dram_blocks == 0 or len(rtc.free_hbm) >= cfg.swap_low_watermark * cfg.hbm_blocks:
        return None
    if len(rtc.copies) >= cfg.max_copies_in_flight:
        return None
    window = islice(lru_order(rtc), 4 * cfg.swap_batch_blocks)  # the next blocks to be evicted
    unsaved = [(at, b) for at, b in enumerate(window) if not rtc.hbm_saved[b]]  # not in DRAM
    if not unsaved:
        return None
    first = unsaved[0][0]  # the coldest one's place in the LRU
    if len(unsaved) < cfg.swap_min_blocks and len(rtc.free_hbm) + first >= cfg.swap_batch_blocks:
        return None  # too few for a copy, and none of them is about to be evicted
    hashes: list[int] = []
    for _, b in unsaved[: cfg.swap_batch_blocks]:
        h = rtc.hbm_hash[b]
        assert h is not None  # a block on the LRU holds indexed KV
        hashes.append(h)
    return copy_to_dram(rtc, hashes)


def _swap_out(rtc: Rtc, blocks: tuple[int, ...]) -> RtcCopyStarted | None:
    """`copy_to_dram` of the chain hashes of `blocks`, which are distinct, cached and not in
    DRAM (the memo's unsaved blocks: on the LRU, indexed, `hbm_saved` 0), so none is filtered
    out: the event is built by C-level maps, without copy_to_dram's checks a block (the test
    of the stateful RTC compares the two)."""
    blocks = blocks[: len(rtc.free_dram) + len(rtc.lru_dram)]
    if not blocks:
        return None
    hashes: tuple[int, ...] = tuple(map(rtc.hbm_hash.__getitem__, blocks))  # type: ignore[arg-type]
    parents = tuple(map(_PARENT, map(rtc.nodes.__getitem__, hashes)))
    dram, evicted = _pick_dram(rtc, len(blocks))
    return RtcCopyStarted(
        copy_id=_copy_id(rtc), kind=SWAP_OUT, hashes=hashes,
        parents=parents, hbm=blocks, dram=tuple(dram), evicted_dram=tuple(evicted),
    )


def _scan(rtc: Rtc, memo: SwapMemo, n: int) -> None:
    """Read the LRU's first n blocks' saved flags into the memo (C-level map/bytes ops: the
    walk of the LRU dicts is the cost)."""
    marked = list(islice(lru_order(rtc), n))
    if len(marked) < 2:  # itemgetter of one key returns the item, not a tuple
        flags = bytes(rtc.hbm_saved[b] for b in marked)
    else:
        flags = bytes(itemgetter(*marked)(rtc.hbm_saved))
    memo.remember(marked, flags)


def finish_copy(rtc: Rtc, copy_id: str, ok: bool, reason: str = "") -> RtcCopyFinished:
    """The executor reports a copy done (or failed): index what arrived."""
    c = rtc.copies.get(copy_id)
    if c is None:
        raise RtcError(f"unknown copy {copy_id!r} (finished twice, or the RTC was cleared)")
    stored: list[int] = []
    parents: list[int | None] = []
    swap = c.kind == SWAP_OUT
    if ok and swap:
        # The common case: none of the blocks reached DRAM otherwise meanwhile (C-level maps)
        found = list(map(rtc.nodes.__getitem__, c.hashes))
        if list(map(_DRAM, found)).count(NONE) == len(found):
            return RtcCopyFinished(copy_id=copy_id, ok=ok, medium=DRAM, stored=tuple(c.hashes),
                                   parents=tuple(map(_PARENT, found)), reason=reason)
    if ok:
        nodes = rtc.nodes
        for h in c.hashes:
            node = nodes[h]
            if (node.dram if swap else node.hbm) == NONE:
                stored.append(h)
                parents.append(node.parent)
    return RtcCopyFinished(copy_id=copy_id, ok=ok, medium=DRAM if c.kind == SWAP_OUT else HBM,
                           stored=tuple(stored), parents=tuple(parents), reason=reason)


def plan_prefetch(rtc: Rtc, queued: list[tuple[int, ...]] | list[list[int]]) -> RtcCopyStarted | None:
    """Background prefetch for the queue: the first queued prompt (in queue order) whose cached
    prefix continues in DRAM gets that run loaded — but only into never-used free HBM blocks and
    only while more than `prefetch_min_free` of HBM is free, so a prefetch never evicts cached
    KV that someone may hit (no thrashing between the tiers). None when nothing qualifies."""
    cfg = rtc.config
    if cfg.dram_blocks == 0 or len(rtc.copies) >= cfg.max_copies_in_flight:
        return None
    room = len(rtc.free_hbm) - int(cfg.prefetch_min_free * cfg.hbm_blocks)
    for chain in queued[: cfg.prefetch_scan]:
        if room <= 0:
            return None
        m = match_by_prefix(rtc, chain)
        if m.dram_blocks and len(m.dram_blocks) <= room:
            return populate(rtc, None, chain, m)
    return None
