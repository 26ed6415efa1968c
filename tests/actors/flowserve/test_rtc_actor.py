"""The RTC actor and its executor under SimDriver: the Table-1 messages end to end, copies over
the emulated fabric, KV events to a subscriber mirrored exactly, refusals, exact replay."""

from __future__ import annotations

import pytest
from fsharness import TEST_SRC, assert_replays, driver, events_of, out_to

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.rtc import messages as m
from deepserve.actors.flowserve.rtc.actor import RtcActor
from deepserve.actors.flowserve.rtc.executor import RtcExecutor
from deepserve.actors.ports.faults import LinkDown
from deepserve.adapters.hardware.devices.topology import (
    gen1_cluster,
    host_addr,
    npu_addr,
    spawn_topology,
)

RTC, EXE, SUB = "te/0/dp/0/rtc", "te/0/dp/0/rtc-exec", "ext/router"
CFG = {"hbm_blocks": 8, "dram_blocks": 8, "block_tokens": 16, "swap_low_watermark": 0.0}
BLOCK_BYTES = 2 << 20  # one block's KV on one rank


def build(executor: bool = True, tp: int = 2):
    d = driver()
    if executor:
        spawn_topology(d, gen1_cluster(1), variance=False)
        npus = [npu_addr(0, i) for i in range(tp)]
        d.spawn(EXE, RtcExecutor, npus=npus, host=host_addr(0), block_bytes=BLOCK_BYTES,
                hbm_blocks=CFG["hbm_blocks"], master=RTC)
    d.spawn(RTC, RtcActor, config=CFG, executor=EXE if executor else None, subscribers=[SUB])
    return d


class Client:
    def __init__(self, d) -> None:
        self.d, self.t, self.n = d, 0.0, 0

    def __call__(self, cls, **kw):
        """Send one request at the next millisecond after everything settled; its answer."""
        self.n += 1
        self.t = max(self.t, self.d.now) + 0.001
        req_id = f"q{self.n}"
        self.d.inject(RTC, cls(req_id=req_id, **kw), at=self.t, src=TEST_SRC)
        self.d.run()
        (ans,) = [a for _, a in out_to(self.d) if getattr(a, "req_id", None) == req_id]
        return ans


def mirror_of(d) -> rtc.Mirror:
    mirror = rtc.Mirror()
    for _, batch in out_to(d, SUB):
        for ev in batch.events:
            mirror.fold(ev)
    return mirror


def test_table1_round_trip_over_the_fabric() -> None:
    d = build()
    q = Client(d)
    chain = (101, 102, 103)
    a = q(m.AllocBlocks, seq="r1", num_blocks=3)
    assert a == m.BlocksAllocated(req_id=a.req_id, seq="r1", blocks=(0, 1, 2))
    assert q(m.CacheBlocks, seq="r1", block_hashes=chain).num_cached == 3
    hit = q(m.MatchByPrefixToken, block_hashes=chain + (999,))
    assert hit.hbm_blocks == (0, 1, 2) and hit.dram_blocks == () and hit.block_tokens == 16
    assert q(m.Free, seq="r1") == m.Freed(req_id=f"q{q.n}", seq="r1")
    # Copy to DRAM: both TP ranks move 3 blocks NPU -> host over PCIe, block by block
    acc = q(m.Copy, block_hashes=chain)
    assert acc.num_blocks == 3 and acc.copy_id is not None
    (done,) = [x for _, x in out_to(d) if isinstance(x, m.CopyDone)]
    assert done == m.CopyDone(copy_id=acc.copy_id, ok=True)
    executed = events_of(d, EXE, "CopyPartEnded")
    assert len(executed) == 2 and all(e.ok for e in executed)
    # evict every HBM copy, then populate r2 from DRAM
    q(m.AllocBlocks, seq="flood", num_blocks=8)
    q(m.Free, seq="flood")
    miss = q(m.MatchByPrefixToken, block_hashes=chain)
    assert miss.hbm_blocks == () and len(miss.dram_blocks) == 3
    pop = q(m.Populate, seq="r2", block_hashes=chain)
    assert pop.num_blocks == 3
    assert q(m.QueryPopulate, copy_id=pop.copy_id).status == "done"
    table = tuple(rtc.block_table(d.actor(RTC).state.rtc, "r2"))
    assert len(table) == 3 and q(m.MatchByPrefixToken, block_hashes=chain).hbm_blocks == table
    # named context cache (ID index)
    assert q(m.CreateCache, cache_id="sys", seq="r2", block_hashes=chain).num_blocks == 3
    by_id = q(m.MatchByID, cache_id="sys")
    assert by_id.block_hashes == chain and len(by_id.hbm_blocks) == 3
    q(m.Free, seq="r2")
    assert q(m.DeleteCache, cache_id="sys").cache_id == "sys"
    assert isinstance(q(m.MatchByID, cache_id="sys"), m.RtcRefused)
    assert_replays(d)


def test_kv_events_mirror_the_index() -> None:
    d = build(executor=False)
    q = Client(d)
    for i in range(6):
        chain = tuple(range(10 * (i % 3), 10 * (i % 3) + 3 + i % 2))
        hit = q(m.MatchByPrefixToken, block_hashes=chain)
        q(m.AllocBlocks, seq=f"r{i}", num_blocks=len(chain) - len(hit.hbm_blocks), shared=hit.hbm_blocks)
        q(m.CacheBlocks, seq=f"r{i}", block_hashes=chain)
        if i % 2:
            q(m.Copy, block_hashes=chain)
        q(m.Free, seq=f"r{i}")
    kinds = {type(e).__name__ for _, b in out_to(d, SUB) for e in b.events}
    assert kinds == {"BlockStored", "BlockRemoved"}
    state = rtc.new_rtc(rtc.RtcConfig(**CFG))
    for ev in events_of(d, RTC):
        if rtc.is_rtc_event(ev):
            rtc.apply(state, ev)
    assert mirror_of(d).view() == rtc.index_view(state) != {}
    assert_replays(d)


def test_refusals_name_the_reason_and_change_nothing() -> None:
    d = build(executor=False)
    q = Client(d)
    assert "out of HBM" in q(m.AllocBlocks, seq="a", num_blocks=9).reason
    assert "unknown sequence" in q(m.Free, seq="nobody").reason
    assert "unknown sequence" in q(m.AppendBlock, seq="nobody").reason
    assert q(m.Copy, block_hashes=(1, 2)).copy_id is None
    assert q(m.QueryPopulate, copy_id="c99").status == "unknown"
    assert events_of(d, RTC) == []
    assert_replays(d)


def test_a_failed_copy_is_reported_and_indexes_nothing() -> None:
    d = build()
    q = Client(d)
    q(m.AllocBlocks, seq="r", num_blocks=2)
    q(m.CacheBlocks, seq="r", block_hashes=(5, 6))
    d.inject("hw/fabric", LinkDown(link="s0/npu0/pcie"), at=q.t + 0.0005, src="ext/fault")
    acc = q(m.Copy, block_hashes=(5, 6))
    (done,) = [x for _, x in out_to(d) if isinstance(x, m.CopyDone)]
    assert done.copy_id == acc.copy_id and not done.ok and done.reason
    assert q(m.QueryPopulate, copy_id=acc.copy_id).status == "failed"
    assert q(m.MatchByPrefixToken, block_hashes=(5, 6)).dram_blocks == ()
    assert_replays(d)


def test_executor_reserves_the_kv_region_on_every_rank() -> None:
    d = build(tp=4)
    d.run()
    reserved = events_of(d, EXE, "KvRegionReserved")
    assert [e.npu for e in reserved] == [npu_addr(0, i) for i in range(4)] and all(e.ok for e in reserved)
    npu_allocs = events_of(d, npu_addr(0, 0))
    assert any(getattr(e, "region", None) == "kv" for e in npu_allocs)


@pytest.mark.parametrize("tp", [1])
def test_executor_failure_when_hbm_is_too_small(tp: int) -> None:
    d = driver()
    spawn_topology(d, gen1_cluster(1), variance=False)
    d.spawn(EXE, RtcExecutor, npus=[npu_addr(0, 0)], host=host_addr(0), block_bytes=1 << 40,
            hbm_blocks=1_000, master=RTC)
    d.spawn(RTC, RtcActor, config=CFG, executor=EXE)
    d.run()
    q = Client(d)
    refused = q(m.AllocBlocks, seq="a", num_blocks=1)
    assert isinstance(refused, m.RtcRefused) and "no KV memory" in refused.reason
    assert_replays(d)


async def test_the_same_actor_answers_under_the_async_driver() -> None:
    from deepserve.core.asyncdriver import AsyncDriver

    async with AsyncDriver() as d:
        d.spawn(RTC, RtcActor, config=CFG)
        a = await d.ask(RTC, m.AllocBlocks(req_id="1", seq="s", num_blocks=2), timeout_s=5.0)
        assert a.blocks == (0, 1)
        await d.ask(RTC, m.CacheBlocks(req_id="2", seq="s", block_hashes=(4, 5)), timeout_s=5.0)
        hit = await d.ask(RTC, m.MatchByPrefixToken(req_id="3", block_hashes=(4, 5, 6)), timeout_s=5.0)
        assert hit.hbm_blocks == (0, 1)
        refused = await d.ask(RTC, m.Free(req_id="4", seq="nobody"), timeout_s=5.0)
        assert isinstance(refused, m.RtcRefused)
