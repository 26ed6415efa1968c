"""Exact-state unit tests of the RTC master: block pool, ref counts, index, tiers, KV events."""

from __future__ import annotations

import copy

import msgspec
import pytest

from deepserve.actors.flowserve import rtc
from deepserve.core.codec import encode


class Pool:
    """An RTC plus the fold: every decision is recorded (applied) and its KV events mirrored."""

    def __init__(self, hbm: int = 8, dram: int = 4, **kw: object) -> None:
        self.r = rtc.new_rtc(rtc.RtcConfig(hbm_blocks=hbm, dram_blocks=dram, block_tokens=4, **kw))
        self.log: list[object] = []
        self.kv: list[object] = []
        self.mirror = rtc.Mirror()

    def rec(self, ev: object) -> object:
        assert ev is not None
        rtc.apply(self.r, ev)
        self.log.append(ev)
        for k in rtc.kv_events_of(ev, 4):
            self.kv.append(k)
            self.mirror.fold(k)
        return ev


def test_allocate_takes_low_blocks_first_and_free_returns_them() -> None:
    p = Pool()
    ev = p.rec(rtc.allocate(p.r, "a", 3))
    assert ev == rtc.RtcBlocksAllocated(seq="a", blocks=(0, 1, 2))
    assert rtc.block_table(p.r, "a") == [0, 1, 2]
    assert p.r.ref[:4] == [1, 1, 1, 0]
    assert rtc.hbm_used_blocks(p.r) == 3 and rtc.kv_usage(p.r) == 3 / 8
    p.rec(rtc.free(p.r, "a"))
    assert p.r.ref == [0] * 8 and rtc.hbm_free_blocks(p.r) == 8
    assert "a" not in p.r.seqs
    with pytest.raises(rtc.RtcError, match="freed twice"):
        rtc.free(p.r, "a")


def test_prefix_hit_shares_blocks_and_counts_references() -> None:
    p = Pool()
    p.rec(rtc.allocate(p.r, "a", 3))
    p.rec(rtc.cache_blocks(p.r, "a", [11, 12, 13]))
    assert p.kv == [rtc.BlockStored(block_hashes=(11, 12, 13), parent_block_hash=None,
                                    token_ids=(), block_size=4, medium="HBM")]
    m = rtc.match_by_prefix(p.r, [11, 12, 99, 13])
    assert m == rtc.Match(hbm_blocks=(0, 1)) and m.num_blocks == 2
    p.rec(rtc.allocate(p.r, "b", 2, shared=m.hbm_blocks))
    assert rtc.block_table(p.r, "b") == [0, 1, 3, 4]
    assert p.r.ref[:5] == [2, 2, 1, 1, 1]
    assert p.r.seqs["b"].num_cached == 2
    # b's third block has a different hash: indexed with b's own chain as parent
    ev = p.rec(rtc.cache_blocks(p.r, "b", [11, 12, 99]))
    assert ev == rtc.RtcBlocksCached(seq="b", num_cached=3, blocks=(3,), hashes=(99,), parents=(12,))
    p.rec(rtc.free(p.r, "a"))
    assert list(p.r.lru_hbm) == [2]  # a's tail block: cached, unreferenced
    p.rec(rtc.free(p.r, "b"))
    # b frees tail first: 4 (unindexed) -> free, then 3, 1, 0 join the LRU after 2
    assert list(p.r.lru_hbm) == [2, 3, 1, 0]
    assert rtc.index_view(p.r) == p.mirror.view()


def test_eviction_takes_free_blocks_before_cached_and_reports_removed() -> None:
    p = Pool(hbm=4, dram=0)
    p.rec(rtc.allocate(p.r, "a", 2))
    p.rec(rtc.cache_blocks(p.r, "a", [1, 2]))
    p.rec(rtc.free(p.r, "a"))
    assert rtc.can_allocate(p.r, 4) and not rtc.can_allocate(p.r, 5)
    ev = p.rec(rtc.allocate(p.r, "b", 3))
    assert ev.blocks == (2, 3, 1) and ev.evicted == (2,)  # free 2,3 first; then LRU front (tail)
    assert p.kv[-1] == rtc.BlockRemoved(block_hashes=(2,), medium="HBM")
    assert rtc.match_by_prefix(p.r, [1, 2]) == rtc.Match(hbm_blocks=(0,))
    with pytest.raises(rtc.RtcError, match="out of HBM"):
        rtc.allocate(p.r, "c", 2)
    # sharing a cached block takes it off the LRU, so it cannot also be counted as free
    assert not rtc.can_allocate(p.r, 1, shared=(0,))


def test_double_free_and_divergence_are_refused() -> None:
    p = Pool()
    ev = rtc.allocate(p.r, "a", 1)
    p.rec(ev)
    with pytest.raises(rtc.Diverged):
        rtc.apply(p.r, ev)  # the same blocks again: not on the free stack any more


def test_swap_out_populate_round_trip_keeps_kv_and_mirror() -> None:
    p = Pool(hbm=4, dram=4)
    p.rec(rtc.allocate(p.r, "a", 3))
    p.rec(rtc.cache_blocks(p.r, "a", [11, 12, 13]))
    p.rec(rtc.free(p.r, "a"))
    out = p.rec(rtc.copy_to_dram(p.r, [11, 12, 13, 11]))
    assert out.kind == rtc.SWAP_OUT and out.hashes == (11, 12, 13) and out.dram == (0, 1, 2)
    assert rtc.hbm_free_blocks(p.r) == 1  # the copy holds its source blocks
    assert rtc.copy_status(p.r, out.copy_id) == "pending"
    p.rec(rtc.finish_copy(p.r, out.copy_id, ok=True))
    assert rtc.copy_status(p.r, out.copy_id) == "done"
    assert list(rtc.lru_order(p.r))[:3] == [0, 1, 2]  # safe in DRAM: evicted first
    p.rec(rtc.allocate(p.r, "b", 4))  # evicts every HBM copy
    assert rtc.match_by_prefix(p.r, [11, 12, 13]) == rtc.Match(dram_blocks=(0, 1, 2))
    assert p.mirror.match([11, 12, 13]) == 3
    p.rec(rtc.free(p.r, "b"))
    m = rtc.match_by_prefix(p.r, [11, 12, 13])
    pop = p.rec(rtc.populate(p.r, "c", [11, 12, 13], m))
    assert rtc.is_loading(p.r, "c") and rtc.block_table(p.r, "c") == list(pop.hbm)
    with pytest.raises(rtc.RtcError, match="being populated"):
        rtc.allocate(p.r, "c", 1)
    assert rtc.match_by_prefix(p.r, [11]) == rtc.Match(dram_blocks=(0,))  # not ready yet
    p.rec(rtc.finish_copy(p.r, pop.copy_id, ok=True))
    assert rtc.match_by_prefix(p.r, [11, 12, 13]).hbm_blocks == pop.hbm
    assert p.r.seqs["c"].num_cached == 3 and not rtc.is_loading(p.r, "c")
    p.rec(rtc.free(p.r, "c"))
    assert sum(p.r.ref) == 0 and sum(p.r.dram_pins) == 0
    assert rtc.index_view(p.r) == p.mirror.view()


def test_failed_populate_releases_the_loading_blocks() -> None:
    p = Pool(hbm=4, dram=4)
    p.rec(rtc.allocate(p.r, "a", 2))
    p.rec(rtc.cache_blocks(p.r, "a", [1, 2]))
    p.rec(rtc.free(p.r, "a"))
    c = p.rec(rtc.copy_to_dram(p.r, [2]))
    p.rec(rtc.finish_copy(p.r, c.copy_id, ok=True))
    p.rec(rtc.allocate(p.r, "x", 3))  # evicts block 1 (hash 2, now in DRAM) and one more
    assert rtc.match_by_prefix(p.r, [1, 2]) == rtc.Match(hbm_blocks=(0,), dram_blocks=(0,))
    p.rec(rtc.free(p.r, "x"))
    m = rtc.match_by_prefix(p.r, [1, 2])
    pop = p.rec(rtc.populate(p.r, "b", [1, 2], m))
    assert rtc.block_table(p.r, "b") == [0, *pop.hbm]
    p.rec(rtc.finish_copy(p.r, pop.copy_id, ok=False, reason="link down"))
    assert rtc.copy_status(p.r, pop.copy_id) == "failed"
    assert rtc.block_table(p.r, "b") == [0] and p.r.seqs["b"].num_cached == 1
    p.rec(rtc.free(p.r, "b"))
    assert sum(p.r.ref) == 0 and sum(p.r.dram_pins) == 0
    assert rtc.index_view(p.r) == p.mirror.view()


def test_background_swap_out_only_under_pressure() -> None:
    p = Pool(hbm=10, dram=10, swap_low_watermark=0.3, swap_batch_blocks=2)
    p.rec(rtc.allocate(p.r, "a", 5))
    p.rec(rtc.cache_blocks(p.r, "a", [1, 2, 3, 4, 5]))
    p.rec(rtc.free(p.r, "a"))
    assert rtc.plan_swap_out(p.r) is None  # 5 of 10 free
    p.rec(rtc.allocate(p.r, "b", 4))
    ev = rtc.plan_swap_out(p.r)  # 1 free < 3: the two coldest cached blocks go to DRAM
    assert ev is not None and ev.hashes == (5, 4) and ev.kind == rtc.SWAP_OUT
    p.rec(ev)
    p.rec(rtc.finish_copy(p.r, ev.copy_id, ok=True))
    nxt = rtc.plan_swap_out(p.r)
    assert nxt is not None and nxt.hashes == (3, 2)  # the saved ones are skipped


def test_a_cleared_pool_forgets_what_the_swap_out_memo_knew() -> None:
    # The memo (state.SwapMemo) is not a field: a clear must drop it with the pool it described.
    p = Pool(hbm=10, dram=10, swap_low_watermark=0.3, swap_batch_blocks=2)
    p.rec(rtc.allocate(p.r, "a", 5))
    p.rec(rtc.cache_blocks(p.r, "a", [1, 2, 3, 4, 5]))
    p.rec(rtc.free(p.r, "a"))
    p.rec(rtc.allocate(p.r, "b", 4))  # 1 free < 3: pressure
    while (ev := rtc.plan_swap_out(p.r)) is not None:  # save every cached block
        p.rec(ev)
        p.rec(rtc.finish_copy(p.r, ev.copy_id, ok=True))
    assert p.r.swap_memo.known() == 5  # the walk that found all five saved
    p.rec(rtc.clear(p.r, "npu reset"))
    assert p.r.swap_memo.known() == 0 and rtc.plan_swap_out(p.r) is None
    p.rec(rtc.allocate(p.r, "c", 9))
    p.rec(rtc.cache_blocks(p.r, "c", [11, 12, 13, 14, 15, 16, 17, 18, 19]))
    p.rec(rtc.free(p.r, "c"))
    p.rec(rtc.allocate(p.r, "d", 8))
    ev = rtc.plan_swap_out(p.r)
    assert ev is not None and ev == rtc.plan_swap_out(copy.deepcopy(p.r))


def test_named_cache_pins_and_match_by_id() -> None:
    p = Pool()
    p.rec(rtc.allocate(p.r, "a", 3))
    p.rec(rtc.cache_blocks(p.r, "a", [7, 8, 9]))
    p.rec(rtc.create_cache(p.r, "ctx-1", "a", [7, 8]))
    p.rec(rtc.free(p.r, "a"))
    hashes, m = rtc.match_by_id(p.r, "ctx-1")
    assert hashes == (7, 8) and m == rtc.Match(hbm_blocks=(0, 1))
    assert p.r.ref[:3] == [1, 1, 0]
    with pytest.raises(rtc.RtcError, match="exists"):
        rtc.create_cache(p.r, "ctx-1", "a", [7])
    p.rec(rtc.delete_cache(p.r, "ctx-1"))
    assert rtc.match_by_id(p.r, "ctx-1") is None and sum(p.r.ref) == 0


def test_clear_empties_everything_and_the_mirror() -> None:
    p = Pool()
    p.rec(rtc.allocate(p.r, "a", 2))
    p.rec(rtc.cache_blocks(p.r, "a", [1, 2]))
    p.rec(rtc.clear(p.r, "npu reset"))
    assert p.r == rtc.new_rtc(p.r.config) and p.mirror.view() == {}
    assert p.kv[-1] == rtc.AllBlocksCleared()


def test_state_encodes_and_replays_identically() -> None:
    p = Pool()
    p.rec(rtc.allocate(p.r, "a", 3))
    p.rec(rtc.cache_blocks(p.r, "a", [1, 2, 3]))
    p.rec(rtc.free(p.r, "a"))
    p.rec(rtc.copy_to_dram(p.r, [1]))
    back = msgspec.msgpack.decode(encode(p.r), type=rtc.Rtc)  # a snapshot round trip keeps the LRU type
    assert back == p.r and type(back.lru_hbm) is type(p.r.lru_hbm)
    assert list(back.lru_hbm) == list(p.r.lru_hbm) and list(back.lru_dram) == list(p.r.lru_dram)  # (plain dicts: == ignores order)
    replayed = rtc.new_rtc(p.r.config)
    for ev in p.log:  # through the codec, as replay reads them
        rtc.apply(replayed, msgspec.msgpack.decode(encode(ev), type=type(ev)))
    assert replayed == p.r and list(replayed.lru_hbm) == list(p.r.lru_hbm)
    p.rec(rtc.allocate(p.r, "b", 1))
    snap = copy.deepcopy(p.r)  # what the kernel keeps at a snapshot: equal and independent
    assert snap == p.r and type(snap.lru_hbm) is type(p.r.lru_hbm)
    assert list(snap.lru_hbm) == list(p.r.lru_hbm) and list(snap.lru_dram) == list(p.r.lru_dram)
    p.rec(rtc.finish_copy(p.r, "c0", ok=True))
    p.rec(rtc.free(p.r, "b"))
    assert snap != p.r and "c0" in snap.copies and snap.seqs["b"].blocks == [3]


def test_config_is_validated_naming_the_field() -> None:
    with pytest.raises(ValueError, match="hbm_blocks"):
        rtc.RtcConfig(hbm_blocks=0)
    with pytest.raises(ValueError, match="swap_low_watermark"):
        rtc.RtcConfig(hbm_blocks=1, swap_low_watermark=1.5)


def test_background_prefetch_uses_only_free_blocks_above_the_floor() -> None:
    p = Pool(hbm=8, dram=4, prefetch_min_free=0.25)
    p.rec(rtc.allocate(p.r, "a", 2))
    p.rec(rtc.cache_blocks(p.r, "a", [1, 2]))
    p.rec(rtc.free(p.r, "a"))
    c = p.rec(rtc.copy_to_dram(p.r, [1, 2]))
    p.rec(rtc.finish_copy(p.r, c.copy_id, ok=True))
    p.rec(rtc.allocate(p.r, "x", 8))  # evicts both HBM copies; nothing free
    p.rec(rtc.free(p.r, "x"))  # x's blocks were never indexed: all 8 are free again
    assert rtc.match_by_prefix(p.r, [1, 2]) == rtc.Match(dram_blocks=(0, 1))
    assert rtc.plan_prefetch(p.r, [[9], [1, 2]]) is not None  # the second queued prompt qualifies
    p.rec(rtc.allocate(p.r, "y", 5))  # 3 free left: 3 - 2 (floor) = 1 < 2 blocks to load
    assert rtc.plan_prefetch(p.r, [[1, 2]]) is None
    p.rec(rtc.free(p.r, "y"))
    ev = p.rec(rtc.plan_prefetch(p.r, [[1, 2]]))
    assert ev.kind == rtc.PREFETCH and ev.evicted_hbm == () and len(ev.hbm) == 2
    p.rec(rtc.finish_copy(p.r, ev.copy_id, ok=True))
    assert rtc.match_by_prefix(p.r, [1, 2]).hbm_blocks == ev.hbm
    assert sum(p.r.ref) == 0 and rtc.index_view(p.r) == p.mirror.view()


def test_benchmark_function_measures_without_leaking() -> None:
    from deepserve.benchmarks.rtc import rtc_rows

    rows = rtc_rows(scale=0.02)
    assert len(rows) == 5 and all(r.value > 0 and r.baseline_value > 0 for r in rows)
    assert all(r.unit == "us/call" for r in rows)


def test_cache_blocks_indexes_only_the_computed_blocks() -> None:
    p = Pool()
    p.rec(rtc.allocate(p.r, "a", 4))
    chain = (1, 2, 3, 4)
    ev = p.rec(rtc.cache_blocks(p.r, "a", chain, num_blocks=2))  # a chunk of 2 blocks ran
    assert ev.hashes == (1, 2) and ev.num_cached == 2
    assert rtc.cache_blocks(p.r, "a", chain, num_blocks=2) is None
    assert p.rec(rtc.cache_blocks(p.r, "a", chain)).hashes == (3, 4)
    assert rtc.match_by_prefix(p.r, chain).hbm_blocks == (0, 1, 2, 3)


def test_a_freed_loading_sequence_detaches_its_copy() -> None:
    p = Pool(hbm=6, dram=4)
    p.rec(rtc.allocate(p.r, "a", 2))
    p.rec(rtc.cache_blocks(p.r, "a", [1, 2]))
    p.rec(rtc.free(p.r, "a"))
    c = p.rec(rtc.copy_to_dram(p.r, [1, 2]))
    p.rec(rtc.finish_copy(p.r, c.copy_id, ok=True))
    p.rec(rtc.allocate(p.r, "x", 6))
    p.rec(rtc.free(p.r, "x"))
    pop = p.rec(rtc.populate(p.r, "s", [1, 2]))
    with pytest.raises(rtc.RtcError, match="being populated"):
        rtc.create_cache(p.r, "ctx", "s", [1, 2])
    p.rec(rtc.free(p.r, "s"))  # cancelled while loading
    p.rec(rtc.allocate(p.r, "s", 1))  # the id comes back as a new sequence
    table = list(rtc.block_table(p.r, "s"))
    p.rec(rtc.finish_copy(p.r, pop.copy_id, ok=False))
    assert rtc.block_table(p.r, "s") == table and p.r.seqs["s"].loading == 0
    p.rec(rtc.free(p.r, "s"))
    assert sum(p.r.ref) == 0 and sum(p.r.dram_pins) == 0 and rtc.hbm_free_blocks(p.r) == 6


def _cold_pair_under_pressure(taken: int) -> Pool:
    """Blocks 1 and 2 cached and cold in HBM; then `taken` blocks held (pressure below 20 free)."""
    p = Pool(hbm=40, dram=40, swap_low_watermark=0.5, swap_batch_blocks=4, swap_min_blocks=3)
    p.rec(rtc.allocate(p.r, "a", 2))
    p.rec(rtc.cache_blocks(p.r, "a", [1, 2]))
    p.rec(rtc.free(p.r, "a"))
    p.rec(rtc.allocate(p.r, "b", taken))
    return p


def test_background_swap_out_waits_for_swap_min_blocks() -> None:
    p = _cold_pair_under_pressure(20)  # 18 free: the cold pair is not next to be evicted
    assert rtc.plan_swap_out(p.r) is None  # 2 cold blocks < swap_min_blocks=3
    p.rec(rtc.allocate(p.r, "c", 1))
    p.rec(rtc.cache_blocks(p.r, "c", [9]))
    p.rec(rtc.free(p.r, "c"))
    ev = rtc.plan_swap_out(p.r)  # three now: one copy takes them all
    assert ev is not None and ev.hashes == (2, 1, 9)


def test_background_swap_out_does_not_wait_when_eviction_is_near() -> None:
    p = _cold_pair_under_pressure(35)  # 3 free: the cold pair is among the next 4 taken
    ev = rtc.plan_swap_out(p.r)
    assert ev is not None and ev.hashes == (2, 1)
    p.rec(ev)
    p.rec(rtc.finish_copy(p.r, ev.copy_id, ok=True))
    assert list(p.r.hbm_saved[:2]) == [1, 1] and rtc.plan_swap_out(p.r) is None
    p.rec(rtc.allocate(p.r, "d", 5))  # evicts them from HBM: DRAM still has them
    assert not any(p.r.hbm_saved)
    assert rtc.match_by_prefix(p.r, [1, 2]).dram_blocks != ()


def test_a_snapshot_keeps_the_lru_order_with_blocks_released_cold() -> None:
    """Dict equality ignores order, and msgpack encodes a dict in the order it stores keys: an
    OrderedDict's `move_to_end(last=False)` (how a swap-out put its blocks at the LRU's front)
    does not change that order, so snapshots logged the LRU wrongly. Now they keep it."""
    p = Pool(hbm=4, dram=4)
    p.rec(rtc.allocate(p.r, "a", 3))
    p.rec(rtc.cache_blocks(p.r, "a", [11, 12, 13]))
    p.rec(rtc.free(p.r, "a"))  # LRU: 2, 1, 0 (tail blocks first)
    out = p.rec(rtc.copy_to_dram(p.r, [12]))  # block 1 is saved to DRAM
    p.rec(rtc.finish_copy(p.r, out.copy_id, ok=True))  # ... and released cold: evicted first
    order = list(rtc.lru_order(p.r))
    assert order == [1, 2, 0]
    back = msgspec.msgpack.decode(encode(p.r), type=rtc.Rtc)
    assert list(rtc.lru_order(back)) == order
    assert list(rtc.lru_order(copy.deepcopy(p.r))) == order
    assert rtc.allocate(p.r, "b", 2).blocks == (3, 1)  # the free block, then the LRU front
